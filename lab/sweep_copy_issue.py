"""Copies issued by the consumer warps (lab only; session 11, call L2).

    python lab/sweep_copy_issue.py --out $OUT/sweep_copy_issue.json

For the quick grid's cases (eval/bench_attention_v3.py QUICK) times, in one process, cuDNN, the BF16
twin, the fused kernel's default launch and ``copy_issue="consumer"`` (the consumer warps issue their
producers' compressed copies and look-ups; the producers wait on a `landed` barrier and only decode)
at the planner's launch, and at 3 stages x 3 CTAs per SM (more copy lead, fewer warps). Each
variant's output is checked bit for bit against the twin at the same split count. The default is
timed first and last (drift check).
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
from bench_attention_v3 import QUICK, Case  # noqa: E402

# (name, LaunchConfig kwargs, head_dims it applies to)
VARIANTS = [
    ("cc", dict(copy_issue="consumer"), (64, 128, 256)),
    ("cc_c3_s3", dict(copy_issue="consumer", ctas_per_sm=3, num_stages=3), (64, 128)),
    ("c3_s3", dict(ctas_per_sm=3, num_stages=3), (128,)),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.fused_attention import plan

    dev = torch.device("cuda")
    t0 = time.time()
    result = dict(harness.provenance(argv=sys.argv), timer="cuda-graph replay, L2 flushed, median of 15",
                  variants={n: kw for n, kw, _ in VARIANTS}, rows=[])
    for shape, B, S in QUICK:
        case = Case(shape, B, S, dev)
        us, same, launch = {}, {}, {}
        us["cudnn"], _ = harness.time_and_error("cudnn", lambda: case.sdpa("cudnn"))
        us["cuda_bf16"], _ = harness.time_and_error("cuda", lambda: case.cuda(LaunchConfig()))
        us["default"], _ = harness.time_and_error("default", lambda: case.gaac(LaunchConfig()))
        same["default"] = case.bit_identical()
        for name, kw, dims in VARIANTS:
            if case.d not in dims:
                continue
            cfg = LaunchConfig(**kw)
            try:
                p = plan(case.B, case.hkv, case.hq // case.hkv, 64, case.d, case.kv.k.table.shape[2] * 64 + 64, dev, cfg)
                launch[name] = dict(p["defines"], splits=p["splits"], smem=p["smem"], threads=p["threads"])
            except ValueError as e:
                print(f"  {name}: {e}", flush=True)
                continue
            us[name], _ = harness.time_and_error(name, lambda: case.gaac(cfg))
            same[name] = case.bit_identical(cfg)
        us["default_again"], _ = harness.time_and_error("default", lambda: case.gaac(LaunchConfig()))
        row = dict(shape=shape, batch=B, context=S, us=us, bit_identical=same, launch=launch,
                   vs_cudnn={k: us["cudnn"] / v for k, v in us.items() if v and k != "cudnn"})
        result["rows"].append(row)
        cells = "  ".join(f"{k} {v:6.1f}" for k, v in us.items() if v)
        print(f"{shape:12s} B={B:2d} {S:6d}: {cells}  same={all(same.values())}", flush=True)
        del case
        torch.cuda.empty_cache()
    harness.write_result(args.out, result)
    print(f"wrote {args.out} ({len(result['rows'])} rows) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
