"""One register-tile launch a few times, for Nsight Compute (lab only):

    ncu ... -k regex:regtile_decode_split --launch-skip 2 --launch-count 1 python lab/experiments/regtile/ncu_one.py FMT W S CTAS [shape:B:S]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

fmt, W, S, ctas = sys.argv[1], *(int(a) for a in sys.argv[2:5])
shape, B, L = (sys.argv[5] if len(sys.argv) > 5 else "qwen3-8b:1:65536").split(":")
bench.F = {"3": bench.F, "4": bench.F4, "4i": bench.F4i}[fmt]
case = bench.Case(shape, int(B), int(L))
f, _ = case.regtile(W, S, ctas, max(1, (132 * ctas) // (case.B * case.hkv)))
for _ in range(4):
    f()
torch.cuda.synchronize()
print("ran", fmt, W, S, ctas, shape, B, L)
