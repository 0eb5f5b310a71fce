"""Fused GAAC v4 decode attention (register tiles) on one GPU vs FA2, cuDNN and our BF16 twin (same process).

    python eval/bench_attention_v4.py --out eval/results/attention_h200.json [--quick] [--sweep] [--budget-s 400]

K/V are KV-like synthetic values (``gaac_hf.calibration.synthetic``), calibrated per kv head, encoded by the
v4 reference codec into shuffled pools (``pack_paged_v4``). Every kernel reads the same values: FA2 / cuDNN
(SDPA backends) the dense BF16 tensors, the BF16 twin (``cuda_bf16``, the kernel whose arithmetic the fused
one runs) a shuffled paged BF16 cache at its own default launch, ``gaac`` the v4 pools at the planner's launch.
Pools are shuffled (``gaac``: the table's indirection at its worst for DRAM locality); with ``--layouts ... in_order``
(default) each row also times the same values with each head's blocks back to back (``gaac_in_order``: the layout a
GAACCache prefill writes, ``lab/cuda-decode-notebook.md`` session 19), same process.
Times are GPU time from CUDA-graph replay with the L2 flushed before every call (``harness.timeit_graph``),
medians. Each row records whether the fused output is bit-identical to the twin at the fused launch
(``bit_identical``; the twin at that launch is timed too, ``cuda_bf16_same_launch``) and the bytes each reads.
A head_dim outside the v4 kernel (``fused_attention_v4.HEAD_DIMS``: 64, 128, 256) would time the baselines and
the v3 kernel (``gaac_v3``) and say so. ``--sweep`` times launch shapes on the key cases.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # eval/harness.py
import harness  # noqa: E402

SHAPES, SAME_SHAPE = harness.ATTENTION_SHAPES, harness.SAME_SHAPE
CTX, BATCH = harness.ATTENTION_CONTEXTS, harness.ATTENTION_BATCHES
T = 64
QUICK = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("qwen3-8b", 1, 16384),
         ("qwen3-8b", 16, 32768), ("smollm2-135m", 1, 65536), ("smollm2-135m", 1, 16384), ("qwen3-8b", 4, 16384)]
LAYOUTS = ("shuffled", "in_order")
SWEEP_CASES = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("qwen3-8b", 1, 16384),
               ("qwen3-8b", 16, 32768), ("smollm2-135m", 1, 32768), ("smollm2-135m", 1, 16384),
               ("smollm2-135m", 16, 32768), ("gemma3", 1, 65536)]


class Case:
    def __init__(self, shape, B, S, dev, seed=0, layout="shuffled"):
        """layout: "shuffled" (blocks in a random order: the table's indirection at its worst for DRAM locality) or
        "in_order" (each head's blocks back to back, the layout a GAACCache prefill writes)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
        from gaac_hf.kernels.cuda.attention import pack_paged_bf16
        from gaac_hf.kernels.cuda.fused_attention_v4 import HEAD_DIMS, pack_paged_v4

        hq, hkv, d = SHAPES[shape]
        self.shape, self.B, self.S, self.hq, self.hkv, self.d = shape, B, S, hq, hkv, d
        self.k = synthetic_kv((B, hkv, S, d), "k", seed, device=dev)
        self.v = synthetic_kv((B, hkv, S, d), "v", seed + 1, device=dev)
        self.q = torch.randn(B, hq, d, generator=torch.Generator(device=dev).manual_seed(seed), device=dev).to(torch.bfloat16)
        (k8, k16), (v8, v16) = calibrate(self.k), calibrate(self.v)
        lens = [S] * B
        self.v4 = d in HEAD_DIMS
        self.bases3 = torch.stack([torch.stack([k8, k16]), torch.stack([v8, v16])])
        shuffle = layout == "shuffled"
        self.kv = pack_paged_v4(self.k, self.v, lens, T, torch.stack([k16, v16]), shuffle=shuffle) if self.v4 else None
        self.pk = pack_paged_bf16(self.k, lens, T, shuffle=shuffle)
        self.pv = pack_paged_bf16(self.v, lens, T, shuffle=shuffle)
        self.out = torch.empty_like(self.q)
        self.kv_bytes = 2 * B * hkv * S * d * 2
        if self.v4:
            self.gaac_bytes = sum(p.pool.numel() + p.tail.numel() * 2 + p.table.numel() * 8 for p in (self.kv.k, self.kv.v))
            self.bf16_blocks = int((self.kv.k.table & 1).sum() + (self.kv.v.table & 1).sum())

    def gaac(self, config=None):
        from gaac_hf.kernels.cuda.fused_attention_v4 import gaac_decode_attention_v4

        return lambda: gaac_decode_attention_v4(self.q, self.kv, launch=config, out=self.out)

    def gaac_v3(self):
        from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3, pack_paged_v3

        kv3 = pack_paged_v3(self.k, self.v, [self.S] * self.B, T, self.bases3)
        return lambda: gaac_decode_attention_v3(self.q, kv3, out=self.out)

    def cuda(self, config=None):
        from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors

        pk, pv = self.pk, self.pv
        return lambda: bf16_decode_attention_tensors(
            self.q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"], pk["num_blocks"],
            pk["tail_len"], config=config, out=self.out)

    def sdpa(self, backend):
        return harness.sdpa_decode(backend, self.q, self.k, self.v)

    def twin_config(self, config=None):
        from gaac_hf.kernels.cuda.fused_attention_v4 import twin_config

        return twin_config(self.q, self.kv, config)

    def bit_identical(self, config=None) -> bool:
        a = self.gaac(config)().clone()
        b = self.cuda(self.twin_config(config))().clone()
        return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


_try = harness.time_and_error
SWEEP = [dict(num_warps=w, num_stages=s, ctas_per_sm=c, waves=x) for (w, s, c, x) in
         ((8, 2, 1, 1), (8, 3, 1, 1), (8, 4, 1, 1), (8, 4, 1, 2), (8, 6, 1, 1), (8, 2, 2, 1), (8, 3, 2, 1),
          (4, 2, 3, 1), (4, 2, 4, 1), (4, 3, 2, 1), (4, 4, 2, 1), (4, 4, 2, 2), (4, 6, 2, 1), (2, 4, 4, 1),
          (2, 6, 4, 1), (2, 8, 4, 1), (4, 2, 1, 1), (2, 2, 3, 1), (2, 3, 2, 1), (4, 3, 1, 1), (4, 2, 2, 1))]
# (4, 2, 1, 1) on: d = 256's 8 KB slots (W4 x 3 stages x 1 CTA is the BF16 twin's own launch: 19.4 us vs 22.6 at W4
# S2); the planner gives compact slots where full ones do not fit (d = 256: W8 x 2 x 1, W4 x 2 x 2)


def parse_launches(specs):
    """``["8:2:1:1", ...]`` (warps:stages:ctas_per_sm:waves) -> sweep entries."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 4 or not all(x.isdigit() for x in parts):
            raise SystemExit(f"--sweep-launches takes W:S:C:X (warps, stages, CTAs per SM, waves), got {spec!r}")
        w, st, c, x = map(int, parts)
        out.append(dict(num_warps=w, num_stages=st, ctas_per_sm=c, waves=x))
    return out


def sweep(case, launches=None):
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda import fused_attention_v4 as F4
    from gaac_hf.kernels.cuda.attention import _sm_count

    rows = []
    for kw in launches or SWEEP:
        try:  # the planner decides what fits (compact slots where full ones do not)
            p = F4.plan(case.B, case.hkv, case.hq // case.hkv, T, case.d, case.S + T, case.q.device,
                        LaunchConfig(num_warps=kw["num_warps"], num_stages=kw["num_stages"],
                                     ctas_per_sm=kw["ctas_per_sm"]))
        except ValueError:
            continue
        if case.hq // case.hkv > 8 and kw["ctas_per_sm"] > 16 // kw["num_warps"]:
            continue
        streams = case.B * case.hkv
        splits = max(1, kw["waves"] * _sm_count(case.q.device) * kw["ctas_per_sm"] // streams)
        # waves 0: the planner's own splits (at least one pipeline step each); else that many waves, >= 256 tokens each
        cfg = LaunchConfig(num_warps=kw["num_warps"], num_stages=kw["num_stages"], ctas_per_sm=kw["ctas_per_sm"],
                           num_splits=p["splits"] if kw["waves"] == 0 else min(splits, max(1, case.S // 256)))
        us, _ = _try(f"gaac {kw}", lambda: case.gaac(cfg))
        same = case.bit_identical(cfg) if us else None
        rows.append(dict(config=kw, splits=cfg.num_splits, compact_slots=p["defines"]["COMPACT_SLOTS"], us=us,
                         bit_identical=same))
        print(f"  sweep {case.shape} B={case.B} {case.S}: {kw} splits {cfg.num_splits} -> {us} same={same}", flush=True)
    return rows


def parse_cases(specs):
    """``["gemma3:1:16384", ...]`` -> ``[("gemma3", 1, 16384), ...]``, checked against the harness shapes."""
    cases = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in SHAPES or not (parts[1].isdigit() and parts[2].isdigit()):
            raise SystemExit(f"--sweep-cases / --grid-cases take SHAPE:BATCH:CONTEXT with SHAPE in {sorted(SHAPES)}, got {spec!r}")
        cases.append((parts[0], int(parts[1]), int(parts[2])))
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the key cases only")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-only", action="store_true", help="the launch sweep without the grid")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS,
                    help="pool layouts timed per row: `gaac` is always the shuffled one; in_order adds gaac_in_order")
    ap.add_argument("--sweep-cases", nargs="+", metavar="SHAPE:B:S",
                    help="sweep these cases instead of the default list, e.g. gemma3:1:16384")
    ap.add_argument("--sweep-launches", nargs="+", metavar="W:S:C:X",
                    help="sweep these launches (warps:stages:CTAs per SM:waves; waves 0 = the planner's splits) instead of the default list")
    ap.add_argument("--grid-cases", nargs="+", metavar="SHAPE:B:S", help="time these grid rows only")
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--merge-chunk", type=int, default=None,
                    help="LaunchConfig.merge_chunk for every CUDA kernel of the grid (0: one-level split merge)")
    args = ap.parse_args(argv)
    from gaac_hf.kernels import LaunchConfig

    launch = LaunchConfig(merge_chunk=args.merge_chunk)
    dev = torch.device("cuda")
    t_start = time.time()
    result = dict(harness.provenance(shapes=SHAPES, argv=sys.argv), cuda=torch.version.cuda, block_size=T,
                  format_version=4, kernel="kernels/cuda/decode_attention_v4.cu (register tiles)",
                  timer="cuda-graph replay, L2 flushed, median of 15", data="synthetic KV-like (calibration.synthetic)",
                  shapes={k: dict(q_heads=v[0], kv_heads=v[1], head_dim=v[2]) for k, v in SHAPES.items()},
                  same_shape=SAME_SHAPE, merge_chunk=args.merge_chunk, sweep={}, rows=[], cut=[])
    if args.sweep or args.sweep_only:
        for shape, B, S in parse_cases(args.sweep_cases) if args.sweep_cases else SWEEP_CASES:
            case = Case(shape, B, S, dev)
            result["sweep"][f"{shape}/B{B}/{S}"] = sweep(case, parse_launches(args.sweep_launches or []))
            del case
            torch.cuda.empty_cache()
            harness.write_result(args.out, result)
    cases = ([] if args.sweep_only else parse_cases(args.grid_cases) if args.grid_cases else QUICK if args.quick
             else [(s, b, c) for s in SHAPES for b in BATCH for c in CTX])
    for shape, B, S in cases:
        if time.time() - t_start > args.budget_s:
            result["cut"].append(dict(shape=shape, batch=B, context=S))
            continue
        case = Case(shape, B, S, dev)
        ref = case.sdpa("fa2")().squeeze(2)
        us, err = {}, {}
        if case.v4:
            us["gaac"], err["gaac"] = _try("gaac", lambda: case.gaac(launch), ref)
            us["cuda_bf16_same_launch"], _ = _try("twin", lambda: case.cuda(case.twin_config(launch)))
        else:
            us["gaac"] = None
            us["gaac_v3"], err["gaac_v3"] = _try("gaac_v3", case.gaac_v3, ref)
        us["cuda_bf16"], err["cuda_bf16"] = _try("cuda", lambda: case.cuda(launch), ref)
        us["fa2"], _ = _try("fa2", lambda: case.sdpa("fa2"))
        us["cudnn"], err["cudnn"] = _try("cudnn", lambda: case.sdpa("cudnn"), ref)
        same = None
        if case.v4:
            try:
                same = case.bit_identical(launch)
            except Exception as e:  # recorded, not fatal
                print(f"  bit check failed: {e}", flush=True)
        row = dict(shape=shape, batch=B, context=S, us=us, rel_err_vs_fa2=err, bit_identical=same, kv_bytes=case.kv_bytes,
                   tbps_bf16_equiv={k: (case.kv_bytes / (v * 1e-6) / 1e12 if v else None) for k, v in us.items()})
        if case.v4:
            row.update(gaac_bytes=case.gaac_bytes, ratio=case.kv_bytes / case.gaac_bytes, bf16_stored_blocks=case.bf16_blocks)
        else:
            row["note"] = f"head_dim {case.d}: not in the v4 kernel's head_dims; gaac_v3 is the v3 fused kernel"
        for base in ("cudnn", "fa2", "cuda_bf16"):
            row[f"gaac_vs_{base}"] = us[base] / us["gaac"] if us[base] and us["gaac"] else None
        if case.v4 and "in_order" in args.layouts:
            # the same values with each head's blocks back to back (as a GAACCache prefill writes them), same process
            del case
            torch.cuda.empty_cache()
            case = Case(shape, B, S, dev, layout="in_order")
            us["gaac_in_order"], err["gaac_in_order"] = _try("gaac in order", lambda: case.gaac(launch), ref)
            us["cuda_bf16_same_launch_in_order"], _ = _try("twin in order", lambda: case.cuda(case.twin_config(launch)))
            # the BF16 skeleton (issue 13) at its own launch over in-order pages: FA2 / cuDNN read contiguous K/V
            us["cuda_bf16_in_order"], err["cuda_bf16_in_order"] = _try("bf16 in order", lambda: case.cuda(launch), ref)
            try:
                row["bit_identical_in_order"] = case.bit_identical(launch)
            except Exception as e:  # recorded, not fatal
                print(f"  bit check (in order) failed: {e}", flush=True)
                row["bit_identical_in_order"] = None
            row["tbps_bf16_equiv"]["gaac_in_order"] = case.kv_bytes / (us["gaac_in_order"] * 1e-6) / 1e12 if us["gaac_in_order"] else None
            for base in ("cudnn", "fa2"):
                row[f"gaac_in_order_vs_{base}"] = us[base] / us["gaac_in_order"] if us[base] and us["gaac_in_order"] else None
                row[f"cuda_bf16_in_order_vs_{base}"] = (us[base] / us["cuda_bf16_in_order"]
                                                        if us[base] and us["cuda_bf16_in_order"] else None)
        result["rows"].append(row)
        f = lambda x: f"{x:8.1f}" if x else "   -    "  # noqa: E731
        print(f"{shape:13s} B={B:2d} {S:6d}: gaac {f(us['gaac'])} bf16 {f(us['cuda_bf16'])} fa2 {f(us['fa2'])} "
              f"cudnn {f(us['cudnn'])}  vs cudnn {row['gaac_vs_cudnn'] or 0:.3f} vs fa2 {row['gaac_vs_fa2'] or 0:.3f} "
              f"same={same} ratio {row.get('ratio', 0):.3f}"
              + (f" | in order {f(us.get('gaac_in_order'))} vs cudnn {row.get('gaac_in_order_vs_cudnn') or 0:.3f} "
                 f"same={row.get('bit_identical_in_order')} bf16 {f(us.get('cuda_bf16_in_order'))}"
                 if "gaac_in_order" in us else ""), flush=True)
        del case
        torch.cuda.empty_cache()
        harness.write_result(args.out, result)
    harness.write_result(args.out, result)
    print(f"wrote {args.out} ({len(result['rows'])} rows, {len(result['cut'])} cut) in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
