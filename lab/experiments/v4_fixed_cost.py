"""Where the fixed part of a v4 decode call goes (lab, one GPU): time against context at a fixed grid.

    python lab/experiments/v4_fixed_cost.py --out $OUT/v4_fixed_cost.json

Qwen3-8B B=1 with 16 splits forced (the planner's grid at 64K): n tiles per warp = context / 16 / 128, so the
intercept of time vs context is the call's fixed cost (launch, prologue, epilogue, in-kernel combine) under the
harness timer; the same for the BF16 twin at that launch, and cuDNN / FA2 at the planner-free SDPA. SmolLM2 B=1 at the
planner's grid and at fewer splits. A zero_() of the output is the timer's floor (one tiny kernel).
"""
import torch
import v4_lab  # noqa: F401 - the frame; puts eval/ on the path

import harness  # noqa: E402
from bench_attention_v4 import Case  # noqa: E402

from gaac_hf.kernels import LaunchConfig  # noqa: E402


def measure(dev):
    for shape, B, splits_list, ctxs in (("qwen3-8b", 1, (16,), (2048, 4096, 8192, 16384, 32768, 65536)),
                                         ("smollm2-135m", 1, (None, 44, 22, 11), (4096, 16384, 32768))):
        for S in ctxs:
            case = Case(shape, B, S, dev)
            row = dict(shape=shape, batch=B, context=S, us={})
            row["us"]["floor_zero"] = harness.timeit_graph(lambda: case.out.zero_())
            for sp in splits_list:
                cfg = LaunchConfig(num_splits=sp) if sp else LaunchConfig()
                tag = f"splits{sp}" if sp else "planner"
                row["us"][f"gaac_{tag}"], _ = harness.time_and_error(tag, lambda: case.gaac(cfg))
                row["us"][f"twin_{tag}"], _ = harness.time_and_error(tag, lambda: case.cuda(case.twin_config(cfg)))
            row["us"]["cudnn"], _ = harness.time_and_error("cudnn", lambda: case.sdpa("cudnn"))
            row["us"]["fa2"], _ = harness.time_and_error("fa2", lambda: case.sdpa("fa2"))
            yield row
            print(shape, B, S, {k: round(v, 2) for k, v in row["us"].items() if v}, flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    v4_lab.run(measure)
