"""Recheck of the CPU decode ratio at one context: one GAAC prefill, then ``eval/bench_cpu_decode.py``'s
interleaved decode steps (DynamicCache filled with the GAAC cache's decoded K/V vs the GAAC cache,
alternating in this process). Cheaper than a whole bench row when only the decode ratio is in doubt.

    python lab/experiments/cpu_decode_recheck.py CONTEXT STEPS > lab/results/cpu_decode_recheck_<context>.json
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402
import harness  # noqa: E402
import torch  # noqa: E402

import gaac_hf  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402

torch.set_num_threads(2)
model, tok = load_smollm2()
gaac_hf.register()
n, steps = int(sys.argv[1]), int(sys.argv[2])
ids = B._tokens(tok, n)
model.set_attn_implementation("gaac")
cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
with torch.no_grad():
    out = model(ids, past_key_values=cache, use_cache=True)
nxt = out.logits[:, -1:].argmax(-1)
del out
res = B.interleaved(model, cache, nxt, steps)
res["loadavg_after"] = os.getloadavg()
res.update(context=n, steps=steps, commit=harness.git_state()[0])
print(json.dumps(res, indent=1))
