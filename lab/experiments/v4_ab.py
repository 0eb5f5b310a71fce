"""A/B of fused v4 kernel defines on the key attention cases (lab, one GPU): the planner's launch with a define
forced to each value, bit-identity with the twin at that launch, cuDNN / FA2 in the same process.

    python lab/experiments/v4_ab.py --define CONST_REGS --values 0 1 --out $OUT/v4_ab.json
"""
import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import harness  # noqa: E402
from bench_attention_v4 import Case  # noqa: E402

CASES = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("qwen3-8b", 1, 16384),
         ("qwen3-8b", 16, 32768), ("smollm2-135m", 1, 32768), ("smollm2-135m", 1, 65536),
         ("gemma3", 1, 65536)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--define", required=True)
    ap.add_argument("--values", type=int, nargs="+", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from gaac_hf.kernels.cuda import fused_attention_v4 as F4

    orig = F4.plan
    rows = []
    for shape, B, S in CASES:
        case = Case(shape, B, S, torch.device("cuda"))
        row = dict(shape=shape, batch=B, context=S, us={}, same={})
        for v in a.values:
            def plan(*args, _v=v, **kw):
                p = orig(*args, **kw)
                p["defines"][a.define] = _v
                return p
            F4.plan = plan
            row["us"][str(v)], _ = harness.time_and_error(f"v={v}", lambda: case.gaac())
            row["same"][str(v)] = case.bit_identical()
        F4.plan = orig
        row["us"]["cudnn"], _ = harness.time_and_error("cudnn", lambda: case.sdpa("cudnn"))
        row["us"]["fa2"], _ = harness.time_and_error("fa2", lambda: case.sdpa("fa2"))
        rows.append(row)
        print(shape, B, S, {k: round(x, 1) for k, x in row["us"].items() if x}, row["same"], flush=True)
        del case
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(dict(harness.provenance(argv=sys.argv), define=a.define, rows=rows), indent=1))


if __name__ == "__main__":
    main()
