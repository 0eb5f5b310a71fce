"""One decode-attention call of the BF16 twin, FA2 or cuDNN, for Nsight Compute (lab only; issue 13's large-batch gap).

The case is eval/bench_attention_bf16.py's (shuffled paged pools for the twin, dense [B, H, S, D] for SDPA). The
implementation runs 3 times to warm up, then once inside the NVTX range "prof", so

    ncu --nvtx --nvtx-include "prof/" --section SpeedOfLight --section MemoryWorkloadAnalysis ... \
        python lab/experiments/twin_ncu_one.py qwen3-8b:16:32768 twin|fa2|cudnn [NAME=V,...]

profiles every kernel of exactly one call (FA2's split-KV kernel and its combine, cuDNN's kernels, the twin's one).
A third argument forces twin defines (lab/experiments/forced_defines.py), e.g. L2_HINT=128.
"""
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
from bench_attention_bf16 import Case  # noqa: E402

shape, B, S = sys.argv[1].split(":")
impl = sys.argv[2]
if len(sys.argv) > 3:
    from forced_defines import force_defines  # noqa: E402
    from gaac_hf.kernels.cuda import attention as A  # noqa: E402
    force_defines(A, {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3].split(","))})
case = Case(shape, int(B), int(S), torch.device("cuda"))
fn = {"twin": lambda: case.cuda(), "fa2": lambda: case.sdpa("fa2"), "cudnn": lambda: case.sdpa("cudnn")}[impl]()
for _ in range(3):
    fn()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("prof")
fn()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("ran", shape, B, S, impl)
