"""One decode step's attention of one SmolLM2 layer on the CPU, GAAC tiled C++ vs DynamicCache + sdpa
(issue 16): the tiled call on the compressed layer vs what DynamicCache + sdpa does per layer and step
(``torch.cat`` of the new token onto K and V, then SDPA with the model's GQA handling), 2 threads,
interleaved, medians over ``reps``. The K/V are real: one GAAC prefill of ``context`` WikiText tokens,
saved to ``/tmp/gaac_kv_<context>.pt`` on the first run.

    python lab/experiments/cpu_attention_micro.py CONTEXT [REPS] [LAYERS ...]
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402

import gaac_hf  # noqa: E402
from gaac_hf.cache import tiled  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402

torch.set_num_threads(2)
ctx = int(sys.argv[1])
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
layers = [int(x) for x in sys.argv[3:]] or [0, 15, 29]
path = Path(f"/tmp/gaac_kv_{ctx}.pt")
model, tok = load_smollm2()
gaac_hf.register()
if not path.exists():
    model.set_attn_implementation("gaac")
    cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
    with torch.no_grad():
        model(B._tokens(tok, ctx), past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.save([layer.full_kv() for layer in cache.layers], path)
kvs = torch.load(path)
model.set_attn_implementation("gaac")
res = {}
gen = torch.Generator().manual_seed(0)
for li in layers:
    k, v = kvs[li]
    cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
    layer = cache.layers[li]
    layer.update(k, v)
    layer._awaiting_attention, layer._recent = False, None
    q = (torch.randn(1, 9, 1, 64, generator=gen) * 2).bfloat16()
    newk, newv = k[:, :, -1:].clone(), v[:, :, -1:].clone()
    times = {"gaac": [], "dynamic_cat_sdpa": [], "dynamic_sdpa_only": []}
    for _ in range(reps):
        t = time.perf_counter()
        tiled.tiled_attention(q, layer, None, 0.125)
        times["gaac"].append(time.perf_counter() - t)
        t = time.perf_counter()
        kk, vv = torch.cat([k, newk], 2), torch.cat([v, newv], 2)
        torch.nn.functional.scaled_dot_product_attention(q.view(1, 3, 3, 64), kk, vv, scale=0.125)
        times["dynamic_cat_sdpa"].append(time.perf_counter() - t)
        t = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q.view(1, 3, 3, 64), k, v, scale=0.125)
        times["dynamic_sdpa_only"].append(time.perf_counter() - t)
    res[li] = {n: statistics.median(x) * 1e3 for n, x in times.items()} | {"min_gaac_ms": min(times["gaac"]) * 1e3}
    print(li, json.dumps(res[li]), flush=True)
print(json.dumps({"context": ctx, "ms": res}))
