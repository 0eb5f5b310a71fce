"""A/B of BF16 twin kernel defines (decode_attention.cu) at the planner's launch (lab only): each case x variant timed
in one process (eval/harness.py's graph timer, L2 flushed), every variant's output checked bit for bit against the
default's (the defines change when loads go out, never the arithmetic). Rows as v4_define_ab.py writes them, so
ab_verdict.py reads them.

    python lab/experiments/twin_define_ab.py --out $OUT/twin_ab.json --cases qwen3-8b:1:65536 --variants "" SPEC_ENTRIES=1
"""
import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import harness  # noqa: E402
from bench_attention_bf16 import Case  # noqa: E402
from bench_attention_v4 import parse_cases  # noqa: E402
from forced_defines import force_defines, write_ab  # noqa: E402

from gaac_hf.kernels.cuda import attention as A  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--cases", nargs="+", required=True)
ap.add_argument("--variants", nargs="+", required=True, help='"" (the planner\'s defines) or NAME=V[,NAME=V]')
args = ap.parse_args()

forced = force_defines(A, {})
rows = []
for shape, B, S in parse_cases(args.cases):
    case = Case(shape, B, S, torch.device("cuda"))
    ref = None
    for v in args.variants:
        forced.clear()
        forced.update({k: int(x) for k, x in (kv.split("=") for kv in v.split(",") if kv)})
        us, _ = harness.time_and_error(f"{shape} twin {v}", lambda: case.cuda())
        out = case.cuda()().clone() if us else None
        if v == "":
            ref = out
        same = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16))) if out is not None and ref is not None else None
        rows.append(dict(shape=shape, batch=B, context=S, variant=v or "default", us=us, bit_identical=same))
        print(f"  {shape} B={B} {S} twin [{v or 'default'}]: {us} us same={same}", flush=True)
    del case
    torch.cuda.empty_cache()
write_ab(args.out, rows, REPO)
