"""Where a CPU prefill's time and memory go, DynamicCache + sdpa vs GAACCache v3 (issue 16), SmolLM2.

One process, ``reps`` prefills of each cache alternating (ABBA) after a short warm-up, 2 threads; per
GAAC prefill the time inside ``GAACLayer.append`` (the encoder and pack), inside ``gaac_attention_forward``
and inside SDPA; per dynamic prefill the time inside SDPA. ``--memory KIND``: instead, one prefill of
that cache kind in this (fresh) process and its ``ru_maxrss`` before / after, with ``logits_to_keep``.

    python lab/experiments/cpu_prefill_profile.py CONTEXT REPS [--logits-to-keep N] [--memory dynamic|gaac|none]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import gaac_hf  # noqa: E402
import gaac_hf.cache.attention as att  # noqa: E402
import gaac_hf.cache.layer as layer_mod  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("context", type=int)
ap.add_argument("reps", type=int)
ap.add_argument("--logits-to-keep", type=int, default=0)
ap.add_argument("--memory", default=None)
a = ap.parse_args()

torch.set_num_threads(2)
model, tok = load_smollm2()
gaac_hf.register()
ids = B._tokens(tok, a.context)
stages = {"append": 0.0, "gaac_attention": 0.0, "sdpa": 0.0}


def timed(fn, key):
    return B.timed(fn, stages, key)


layer_mod.GAACLayer.append = timed(layer_mod.GAACLayer.append, "append")
import transformers.integrations.sdpa_attention as sd  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

sd_fn = timed(sd.sdpa_attention_forward, "sdpa")
AttentionInterface._global_mapping["sdpa"] = sd_fn
att._sdpa = lambda: sd_fn
AttentionInterface._global_mapping["gaac"] = timed(att.gaac_attention_forward, "gaac_attention")


def prefill(kind, x):
    if kind == "gaac":
        model.set_attn_implementation("gaac")
        cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
    elif kind == "dynamic":
        model.set_attn_implementation("sdpa")
        cache = DynamicCache(config=model.config)
    else:
        model.set_attn_implementation("sdpa")
        cache = None
    for k in stages:
        stages[k] = 0.0
    t = time.perf_counter()
    out = model(x, past_key_values=cache, use_cache=cache is not None, logits_to_keep=a.logits_to_keep)
    dt = time.perf_counter() - t
    return dt, dict(stages), cache, out


with torch.no_grad():
    if a.memory:
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        dt, st, cache, out = prefill(a.memory, ids)
        print(json.dumps({"kind": a.memory, "context": a.context, "prefill_s": dt, "stages": st, "rss_before_mb": r0,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "logits_to_keep": a.logits_to_keep}))
        sys.exit()
    for kind in ("dynamic", "gaac"):
        prefill(kind, ids[:, :256])
    res = {"dynamic": [], "gaac": []}
    for i in range(a.reps):
        for kind in (("dynamic", "gaac") if i % 2 == 0 else ("gaac", "dynamic")):
            dt, st, cache, out = prefill(kind, ids)
            del cache, out
            res[kind].append({"s": dt, "load": os.getloadavg()[0], **st})
            print(kind, json.dumps(res[kind][-1]), flush=True)
    med = {k: statistics.median(r["s"] for r in v) for k, v in res.items()}
    print(json.dumps({"context": a.context, "median": med, "ratio": med["gaac"] / med["dynamic"],
                      "min_ratio": min(r["s"] for r in res["gaac"]) / min(r["s"] for r in res["dynamic"]), "runs": res}))
