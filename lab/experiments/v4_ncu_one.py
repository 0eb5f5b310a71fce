"""One product v4 launch a few times, for Nsight Compute (lab only), with kernel defines forced:

    ncu ... -k regex:gaac_v4_decode_split --launch-skip 2 --launch-count 1 \
        python lab/experiments/v4_ncu_one.py qwen3-8b:1:65536 TABLE_WINDOW=1
        python lab/experiments/v4_ncu_one.py gemma3:1:65536 launch=8:2:1     # warps:stages:ctas_per_sm
"""
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
from bench_attention_v4 import Case  # noqa: E402
from forced_defines import force_defines  # noqa: E402

from gaac_hf.kernels.cuda import fused_attention_v4 as F4  # noqa: E402

shape, B, L = sys.argv[1].split(":")
launch = [a.split("=")[1] for a in sys.argv[2:] if a.startswith("launch=")]
forced = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in sys.argv[2:] if not kv.startswith("launch="))
config = None
if launch:
    from gaac_hf.kernels import LaunchConfig  # noqa: E402

    w, s_, c = (int(x) for x in launch[0].split(":"))
    config = LaunchConfig(num_warps=w, num_stages=s_, ctas_per_sm=c)
force_defines(F4, forced)
case = Case(shape, int(B), int(L), torch.device("cuda"))
f = case.gaac(config)
for _ in range(4):
    f()
torch.cuda.synchronize()
print("ran", shape, B, L, forced, config)
