"""(Historical: the FIX_LAG variant this sweeps was removed after call N1, session 13; it runs at 443f250.)
FIX_LAG (software-pipelined producers) against the default, timed in one process (lab only; session 12).

    python lab/sweep_fix_lag.py --out $OUT/sweep_fix_lag.json [--cases qwen3-8b:1:65536,...] [--rounds 2]

For each case times cuDNN, the BF16 twin, the fused kernel's default launch and the launch variants below,
in `rounds` interleaved rounds (default, variants, default, variants, ...: drift shows as the spread of the
default's rounds), each by harness.timeit_graph (CUDA-graph replay, L2 flushed, median of 15). Every fused
variant's output is compared bit for bit with the BF16 twin at the same split count (Case.bit_identical).
The controls separate the reordering from the occupancy it costs: `k2` = today's loop at 2 decoded K slots
(3 CTAs per SM at d=128, as `lag_ds2`), `ds3` = today's loop at 3 decoded K and V slots (as `lag`).
The result file is rewritten after every case, so a run cut by its timeout keeps the cases it finished.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "eval"))
import harness  # noqa: E402
from bench_attention_v3 import T, Case  # noqa: E402

# (name, LaunchConfig kwargs)
VARIANTS = [
    ("lag", dict(fix_lag=1)),                          # planner: 3 decoded slots (d=128: 2 CTAs per SM)
    ("lag_ds2", dict(fix_lag=1, decoded_slots=2)),     # 2 slots: d=128 3 CTAs, producer coupled to the consumer
    ("k2", dict(decoded_k_slots=2)),                   # control for lag_ds2: today's loop, same occupancy
    ("ds3", dict(decoded_slots=3, decoded_k_slots=3)),  # control for lag: today's loop, same rings
    ("lag_w1", dict(fix_lag=1, num_warps=1)),          # one consumer per CTA: more, smaller CTAs with 3 slots
]
CASES = "qwen3-8b:1:65536,qwen3-8b:4:65536,smollm2-135m:1:65536,gemma3:1:65536"


def _compile(job):
    from gaac_hf.kernels.cuda import runtime

    source, defines, arch = job
    runtime.compile_cubin(source, defines, arch)  # into the disk cache that runtime.load reads
    return source


def precompile(specs, chosen, dev, workers):
    """Every fused and twin cubin the cases need, compiled in parallel processes (NVRTC, ~3-8 s each)
    before any timing: the timed process then loads them from the disk cache."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda import attention as A, runtime
    from gaac_hf.kernels.cuda import fused_attention as F

    hq_hkv_d = harness.ATTENTION_SHAPES
    arch = runtime.arch_of(dev)
    jobs = {}
    for shape, B, S in specs:
        hq, hkv, d = hq_hkv_d[shape]
        mt = (S // T) * T + T
        for kw in [{}] + [kw for _, kw in chosen]:
            try:
                p = F.plan(B, hkv, hq // hkv, T, d, mt, dev, LaunchConfig(**kw))
            except ValueError:
                continue
            jobs[repr(sorted(p["defines"].items()))] = (F.SOURCE, p["defines"], arch)
            tw = A.plan(B, hkv, hq // hkv, T, d, mt, dev, LaunchConfig(num_splits=p["splits"], num_warps=p["warps"]))
            jobs[repr(sorted(tw["defines"].items()))] = (A.SOURCE, tw["defines"], arch)
        tw = A.plan(B, hkv, hq // hkv, T, d, mt, dev, LaunchConfig())
        jobs[repr(sorted(tw["defines"].items()))] = (A.SOURCE, tw["defines"], arch)
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile, jobs.values()))
    print(f"precompiled {len(jobs)} cubins in {time.time() - t0:.0f} s", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(n for n, _ in VARIANTS))
    ap.add_argument("--workers", type=int, default=12, help="processes compiling the cubins first (0: none)")
    args = ap.parse_args(argv)
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.fused_attention import plan

    dev = torch.device("cuda")
    t0 = time.time()
    chosen = [(n, kw) for n, kw in VARIANTS if n in args.variants.split(",")]
    result = dict(harness.provenance(argv=sys.argv), timer="cuda-graph replay, L2 flushed, median of 15",
                  variants={n: kw for n, kw in chosen}, rounds=args.rounds, rows=[])
    specs = [(c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in args.cases.split(",")]
    if args.workers:
        precompile(specs, chosen, dev, args.workers)
    for shape, B, S in specs:
        case = Case(shape, B, S, dev)
        us, same, launch = {}, {}, {}
        cfgs = {"default": LaunchConfig()}
        for name, kw in chosen:
            cfg = LaunchConfig(**kw)
            try:
                p = plan(case.B, case.hkv, case.hq // case.hkv, T, case.d, case.kv.k.table.shape[2] * T + T, dev, cfg)
            except ValueError as e:
                print(f"  {name}: {e}", flush=True)
                continue
            cfgs[name] = cfg
            launch[name] = dict(p["defines"], splits=p["splits"], smem=p["smem"], threads=p["threads"])
        p = plan(case.B, case.hkv, case.hq // case.hkv, T, case.d, case.kv.k.table.shape[2] * T + T, dev, LaunchConfig())
        launch["default"] = dict(p["defines"], splits=p["splits"], smem=p["smem"], threads=p["threads"])
        for name, cfg in cfgs.items():  # bits first (a deadlock would show here, before any timing)
            print(f"  {shape} B={B}: checking {name} ({launch[name]['MIN_CTAS_PER_SM']} CTAs/SM, "
                  f"{launch[name]['STAGES']} stages, {launch[name]['DEC_STAGES']} decoded slots)", flush=True)
            same[name] = case.bit_identical(cfg)
            print(f"  {name}: same bits as the twin: {same[name]}", flush=True)
        us["cudnn"], _ = harness.time_and_error("cudnn", lambda: case.sdpa("cudnn"))
        us["cuda_bf16"], _ = harness.time_and_error("cuda", lambda: case.cuda(LaunchConfig()))
        rounds = {name: [] for name in cfgs}
        for _ in range(args.rounds):
            for name, cfg in cfgs.items():
                t, _ = harness.time_and_error(name, lambda: case.gaac(cfg))
                rounds[name].append(t)
        for name, ts in rounds.items():
            ok = [t for t in ts if t]
            us[name] = min(ok) if ok else None
        row = dict(shape=shape, batch=B, context=S, us=us, rounds_us=rounds, bit_identical=same, launch=launch,
                   vs_default={k: us["default"] / v for k, v in us.items() if v and us.get("default")},
                   vs_cudnn={k: us["cudnn"] / v for k, v in us.items() if v and us.get("cudnn") and k != "cudnn"})
        result["rows"].append(row)
        harness.write_result(args.out, result)
        cells = "  ".join(f"{k} {v:6.1f}" for k, v in us.items() if v)
        print(f"{shape:12s} B={B:2d} {S:6d}: {cells}  same={all(same.values())}  ({time.time() - t0:.0f} s)", flush=True)
        del case
        torch.cuda.empty_cache()
    print(f"wrote {args.out} ({len(result['rows'])} rows) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
