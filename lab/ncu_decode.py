"""Run one decode-attention case a few times (our CUDA kernel, cuDNN, FA2) for Nsight Compute:

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
        -k regex:"gaac_bf16|cudnn|flash" --launch-skip 3 --launch-count 3 python lab/ncu_decode.py
"""
import sys

import torch

sys.path.insert(0, "eval")
from bench_attention_bf16 import Case  # noqa: E402

from gaac_hf.kernels import LaunchConfig  # noqa: E402

case = Case("qwen3-8b", 1, 65536, torch.device("cuda"))
cfg = LaunchConfig(num_warps=4, num_stages=int(sys.argv[1]) if len(sys.argv) > 1 else 3, ctas_per_sm=1)
fns = [case.cuda(cfg), case.sdpa("cudnn"), case.sdpa("fa2")]
for f in fns:
    for _ in range(4):
        f()
torch.cuda.synchronize()
