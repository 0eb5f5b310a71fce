"""Run the fused v3 kernel (Qwen3-8B shape, B=1, 64K) a few times for Nsight Compute, and dump the
SASS of its cubin (the disk cache) for instruction counts:

    ncu --section WarpStateStats --section SourceCounters ... -k regex:gaac_v3 --launch-skip 2 \
        --launch-count 1 python lab/ncu_fused.py W STAGES CTAS
"""
import sys

import torch

sys.path.insert(0, "eval")
from bench_attention_v3 import Case  # noqa: E402

from gaac_hf.kernels import LaunchConfig  # noqa: E402

w, s, c = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (2, 6, 2)
case = Case("qwen3-8b", 1, 65536, torch.device("cuda"))
f = case.gaac(LaunchConfig(num_warps=w, num_stages=s, ctas_per_sm=c))
for _ in range(4):
    f()
torch.cuda.synchronize()
