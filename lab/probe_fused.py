"""Where the fused v3 kernel's time goes: per-phase clock64 cycles and work switched off (lab only).

    python lab/probe_fused.py --out $OUT/probe_fused.json

Builds the Qwen3-8B B=1 64K case of eval/bench_attention_v3.py, then for each launch configuration
and PROBE mask (decode_attention_v3.cu: 1 = producers skip decoding, 2 = producers skip the
compressed copies, 4 = consumers skip the attention arithmetic) times the kernel (CUDA-graph
replay, L2 flushed) without and with PROF, and reads the PROF counters of one extra launch:
cycles per warp and tile in each phase of each role.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "eval"))
import harness  # noqa: E402
from bench_attention_v3 import T, Case  # noqa: E402

P_NAMES = ["wait_copies", "issue", "wait_empty", "decode", "loop"]
C_NAMES = ["wait_full", "rows", "loop"]


def launcher(case, config, extra: dict, prof: torch.Tensor | None):
    from gaac_hf.kernels.cuda import runtime
    from gaac_hf.kernels.cuda.attention import LOG2E, _counters, split_partials
    from gaac_hf.kernels.cuda.fused_attention import plan

    q, kv = case.q, case.kv
    B, HQ, D = q.shape
    HKV = kv.k.table.shape[1]
    max_blocks = kv.k.table.shape[2]
    p = plan(B, HKV, HQ // HKV, T, D, max_blocks * T + T, q.device, config)
    defines = dict(p["defines"], **extra)
    if prof is not None:
        defines["PROF"] = 1
    mod = runtime.load("decode_attention_v3.cu", defines, q.device)
    splits = p["splits"]
    part_o, part_lse = split_partials(B, HQ, splits, D, q.device)
    k, v = kv.k, kv.v
    out = case.out
    tail = (prof,) if prof is not None else ()

    def f():
        runtime.launch(mod, "gaac_v3_decode_split", (splits, HKV, B), (p["threads"],), p["smem"],
                       q, k.pool, v.pool, k.table, v.table, k.tail, v.tail, k.b8p, k.dbp, v.b8p, v.dbp,
                       kv.num_blocks, kv.tail_len, kv.kv_start, part_o, part_lse, out, _counters(q.device, B * HKV),
                       np.int32(HKV), np.int32(max_blocks), np.int32(p["tokens_per_split"]),
                       np.float32(LOG2E / math.sqrt(D)), *tail, device=q.device)
        return out

    return f, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--probes", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--configs", default="2/3/3/2,2/2/3/1", help="warps/stages/ctas_per_sm/producer_segments,...")
    ap.add_argument("--extra", default="", help="comma-separated define sets (NAME=V:NAME=V), '' = none")
    args = ap.parse_args()
    from gaac_hf.kernels import LaunchConfig

    dev = torch.device("cuda")
    case = Case(args.shape, args.batch, args.context, dev)
    configs = [dict(zip(("num_warps", "num_stages", "ctas_per_sm", "producer_segments", "producer_kinds"),
                        map(int, c.split("/")))) for c in args.configs.split(",")]
    probes = [int(x) for x in args.probes.split(",")]
    extras = [dict(kv.split("=") for kv in e.split(":")) if e else {} for e in args.extra.split(",")]
    extras = [{k: int(v) for k, v in e.items()} for e in extras]
    rows = []
    for kw in configs:
        for probe in probes:
          for extra in extras:
            cfg = LaunchConfig(**kw)
            f, p = launcher(case, cfg, dict(PROBE=probe, **extra), None)
            us = harness.timeit_graph(f)
            if probe == 0 and extra:  # the variant must give the default's bits
                f0, _ = launcher(case, cfg, dict(PROBE=0), None)
                a = f0().clone()
                same = bool(torch.equal(a.view(torch.int16), f().view(torch.int16)))
            else:
                same = None
            prof = torch.zeros(16, dtype=torch.int64, device=dev)
            fp, _ = launcher(case, cfg, dict(PROBE=probe, **extra), prof)
            us_prof = harness.timeit_graph(fp)
            prof.zero_()
            fp()
            torch.cuda.synchronize()
            c = prof.cpu().tolist()
            ptiles, pwarps, ctiles, cwarps = c[6], c[7], c[14], c[15]
            per = lambda x, n: x / n if n else None  # noqa: E731
            prod = {n: per(c[i], ptiles) for i, n in enumerate(P_NAMES)}
            cons = {n: per(c[8 + i], ctiles) for i, n in enumerate(C_NAMES)}
            row = dict(config=kw, probe=probe, extra=extra, same_bits_as_default=same, us=us, us_prof=us_prof, splits=p["splits"], threads=p["threads"],
                       producer_cycles_per_tile=prod, consumer_cycles_per_tile=cons,
                       producer_warps=pwarps, consumer_warps=cwarps, producer_tiles=ptiles, consumer_tiles=ctiles)
            rows.append(row)
            fmt = lambda d: " ".join(f"{k}={v:7.0f}" for k, v in d.items() if v is not None)  # noqa: E731
            print(f"{kw['num_warps']}w s{kw['num_stages']} c{kw['ctas_per_sm']} p{kw['producer_segments']} "
                  f"k{kw.get('producer_kinds', 2)} "
                  f"probe={probe} {extra} same={same}: {us:7.1f} us (prof {us_prof:7.1f}) | P {fmt(prod)} | C {fmt(cons)}", flush=True)
    res = dict(harness.provenance(argv=sys.argv), case=dict(shape=args.shape, batch=args.batch, context=args.context),
               probe_bits={"1": "producers skip decoding", "2": "producers skip compressed copies",
                           "4": "consumers skip attention arithmetic"},
               rows=rows)
    harness.write_result(args.out, res)


if __name__ == "__main__":
    main()
