"""Decode-step ratio at one context without a prefill: the GAAC cache is filled from K/V saved by
``cpu_attention_micro.py`` (``/tmp/gaac_kv_<context>.pt``, real SmolLM2 K/V of a WikiText prompt), then
``eval/bench_cpu_decode.py``'s interleaved steps (DynamicCache with the same K/V vs GAAC). For quick
A/B checks of the decode path while the machine is shared (same load for both caches).

    python lab/experiments/cpu_decode_from_kv.py CONTEXT STEPS
"""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402

import gaac_hf  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402

torch.set_num_threads(2)
n, steps = int(sys.argv[1]), int(sys.argv[2])
model, tok = load_smollm2()
gaac_hf.register()
model.set_attn_implementation("gaac")
cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
for li, (k, v) in enumerate(torch.load(f"/tmp/gaac_kv_{n}.pt")):
    cache.layers[li].update(k, v)
    cache.layers[li]._awaiting_attention, cache.layers[li]._recent = False, None
res = B.interleaved(model, cache, torch.tensor([[tok.eos_token_id]]), steps)
s = res["s_per_token"]
print(json.dumps({"context": n, "s_per_token": s, "ratio": s["gaac"] / s["dynamic"],
                  "min_ratio": res["s_per_token_min"]["gaac"] / res["s_per_token_min"]["dynamic"],
                  "load": os.getloadavg()[0]}))
