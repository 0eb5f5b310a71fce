"""A/B of v4 kernel defines at the planner's launch (lab only): each case x variant timed in one process
(eval/harness.py's graph timer, L2 flushed), the output checked bit for bit against the BF16 twin.

    python lab/experiments/v4_define_ab.py --out $OUT/ab.json --cases gemma3:1:16384 qwen3-8b:1:65536 \
        --variants "" ONE_TILE_BODY=1 launch=4:3:1 launch=4:3:1,CONSTS_SERIAL=1

A variant's ``launch=W:S:C`` (warps:stages:CTAs per SM) replaces the planner's launch (its twin follows it).
"""
import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import harness  # noqa: E402
from bench_attention_v4 import Case, parse_cases  # noqa: E402
from forced_defines import force_defines, write_ab  # noqa: E402

from gaac_hf.kernels.cuda import fused_attention_v4 as F4  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--cases", nargs="+", required=True)
ap.add_argument("--variants", nargs="+", required=True,
                help='"" (the planner\'s defines) or NAME=V[,NAME=V][,launch=W:S:C]')
args = ap.parse_args()

forced = force_defines(F4, {})
rows = []
for shape, B, S in parse_cases(args.cases):
    case = Case(shape, B, S, torch.device("cuda"))
    for v in args.variants:
        forced.clear()
        items = [kv.split("=") for kv in v.split(",") if kv]
        forced.update({k: int(x) for k, x in items if k != "launch"})
        launch = [x for k, x in items if k == "launch"]
        config = None
        if launch:
            from gaac_hf.kernels import LaunchConfig

            w, st, c = (int(x) for x in launch[0].split(":"))
            config = LaunchConfig(num_warps=w, num_stages=st, ctas_per_sm=c)
        us, _ = harness.time_and_error(f"{shape} {v}", lambda: case.gaac(config))
        same = case.bit_identical(config) if us else None
        rows.append(dict(shape=shape, batch=B, context=S, variant=v or "default", us=us, bit_identical=same))
        print(f"  {shape} B={B} {S} [{v or 'default'}]: {us} us same={same}", flush=True)
    del case
    torch.cuda.empty_cache()
write_ab(args.out, rows, REPO)
