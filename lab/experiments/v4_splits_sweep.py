"""Split count vs time for few-stream shapes (lab, one GPU): the planner fills one wave of CTAs, which for one or
three kv heads means ~44-132 splits whose partials one CTA merges at the end. This times the fused v4 kernel at the
planner's split count and at forced counts, cuDNN beside it, same process.

    python lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_sweep.json
"""
import os

import torch
import v4_lab  # noqa: F401 - the frame; puts eval/ on the path

import harness  # noqa: E402
from bench_attention_v4 import Case  # noqa: E402

CASES = [("gemma3", 1, c) for c in (4096, 16384, 32768, 65536)] + [("gemma3", 4, 4096), ("gemma3", 4, 16384)] + \
        [("smollm2-135m", 1, c) for c in (4096, 16384, 32768, 65536)] + [("smollm2-135m", 4, 4096)] + \
        [("qwen3-8b", 1, 4096), ("qwen3-8b", 1, 16384)]
SPLITS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 132)
# SWEEP_CASES="qwen3-8b:1:65536 qwen3-8b:4:65536" SWEEP_SPLITS="3 4 12 14 15 16": other cases / counts (session 36: does
# the time at Qwen3 B=1 64K scale with the CTAs launched, i.e. would the 4 SMs the planner's 128 CTAs leave idle pay?)
if os.environ.get("SWEEP_CASES"):
    CASES = [(c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in os.environ["SWEEP_CASES"].split()]
if os.environ.get("SWEEP_SPLITS"):
    SPLITS = tuple(int(x) for x in os.environ["SWEEP_SPLITS"].split())


def measure(dev):
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda import fused_attention_v4 as F4

    for shape, B, S in CASES:
        case = Case(shape, B, S, dev)
        row = dict(shape=shape, batch=B, context=S, us={}, splits={})
        row["planner_splits"] = case.twin_config().num_splits
        row["us"]["planner"], _ = harness.time_and_error("planner", lambda: case.gaac())
        for sp in SPLITS:
            if sp > S // 64:
                continue
            cfg = LaunchConfig(num_splits=sp)
            row["splits"][str(sp)] = case.twin_config(cfg).num_splits
            row["us"][str(sp)], _ = harness.time_and_error(str(sp), lambda: case.gaac(cfg))
        row["us"]["cudnn"], _ = harness.time_and_error("cudnn", lambda: case.sdpa("cudnn"))
        yield row
        best = min((v, k) for k, v in row["us"].items() if v and k not in ("cudnn",))
        print(shape, B, S, "planner", row["planner_splits"], round(row["us"]["planner"] or 0, 1), "best", best[1],
              round(best[0], 1), "cudnn", round(row["us"]["cudnn"] or 0, 1),
              {k: round(v, 1) for k, v in row["us"].items() if v and k not in ("planner", "cudnn")}, flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    v4_lab.run(measure)
