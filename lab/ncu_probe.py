"""Run one fused-kernel variant (launch + PROBE mask) a few times for Nsight Compute (lab only):

    ncu ... -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python lab/ncu_probe.py W STAGES CTAS PSEG PROBE | default PROBE
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_fused import Case, launcher  # noqa: E402

from gaac_hf.kernels import LaunchConfig  # noqa: E402

if sys.argv[1] == "default":  # the product's default launch, PROBE mask in argv[2]
    config, probe = LaunchConfig(), int(sys.argv[2])
else:
    w, s, c, p, probe = (int(a) for a in sys.argv[1:6])
    config = LaunchConfig(num_warps=w, num_stages=s, ctas_per_sm=c, producer_segments=p)
case = Case("qwen3-8b", 1, 65536, torch.device("cuda"))
f, _ = launcher(case, config, dict(PROBE=probe), None)
for _ in range(4):
    f()
torch.cuda.synchronize()
