"""Where the GAAC v3 append of a CPU prefill spends its time (issue 16, prefill overhead), SmolLM2.

One process, 2 threads. Fills a DynamicCache with a ``context``-token prefill of WikiText-2 test text,
then replays every layer's real K/V into fresh GAACCache layers (``GAACLayer.append``, the path a
prefill takes) ``reps`` times, timing the stages inside it: ``encode_kv`` (the C++ encoder, both
kinds), ``pack_kv`` (the copy into the pools), ``_room`` (pool growth), the fitness check, the tail
copies of ``_finish_append``, and the rest (Python). Then the same stages inside whole model
prefills, GAACCache + gaac and DynamicCache + sdpa alternating (ABBA), with SDPA, the GAAC attention
function and the self_attn / mlp modules timed too; last, ``encode_kv`` alone on 1 and 2 threads.

    python lab/experiments/cpu_append_profile.py CONTEXT REPS
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import gaac_hf  # noqa: E402
import gaac_hf.cache.layer as layer_mod  # noqa: E402
import gaac_hf.cache.pool_v3 as pool_v3  # noqa: E402
from gaac_hf.cache import host  # noqa: E402
from gaac_hf.kernels.cpu import native  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402

context, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(2)
model, tok = load_smollm2()
ids = B._tokens(tok, context)
with torch.no_grad():
    dyn = DynamicCache(config=model.config)
    model(ids, past_key_values=dyn, use_cache=True, logits_to_keep=1)
kv = [(layer.keys, layer.values) for layer in dyn.layers]
print("K", tuple(kv[0][0].shape), kv[0][0].stride(), kv[0][0].is_contiguous(), flush=True)

stages = {}


def wrapped(fn, key):
    """``fn`` adding its wall time to ``stages[key]``."""
    def wrap(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stages[key] = stages.get(key, 0.0) + time.perf_counter() - t
    return wrap


def timed(obj, name, key):
    setattr(obj, name, wrapped(getattr(obj, name), key))


timed(native, "encode_kv", "encode_kv")
timed(native, "pack_kv", "pack_kv")
timed(pool_v3._BlockPoolV3, "_room", "room")
timed(host._FitnessCheck, "observe", "fitness")
timed(layer_mod.GAACLayer, "_finish_append", "finish_append")
timed(layer_mod.GAACLayer, "_ensure_table", "ensure_table")
timed(layer_mod.GAACLayer, "lazy_initialization", "lazy_init")
timed(layer_mod.GAACLayer, "append", "append")

runs = []
with torch.no_grad():
    for i in range(reps + 1):
        cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
        stages.clear()
        t = time.perf_counter()
        for li, (k, v) in enumerate(kv):
            cache.layers[li].update(k, v)
            cache.layers[li]._awaiting_attention = False
            cache.layers[li]._recent = None
        total = time.perf_counter() - t
        if i:  # the first is a warm-up (library load, first allocations)
            runs.append({"total": total, **stages, "load": os.getloadavg()[0]})
            print(json.dumps(runs[-1]), flush=True)
    nfull = context // 64
    g = cache.layers[0]._pools[0].geometry
    bases = cache.layers[0]._pools[0]._kv_bases[0]
    one = {}
    for nt in (1, 2):
        torch.set_num_threads(nt)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            for k, v in kv:
                native.library()  # noqa
                rows, nbytes, st = native.encode_kv.__wrapped__(k, v, nfull, bases, g) if hasattr(native.encode_kv, "__wrapped__") else native.encode_kv(k, v, nfull, bases, g)
            ts.append(time.perf_counter() - t)
        one[nt] = statistics.median(ts)
    blocks = 2 * len(kv) * k.shape[0] * k.shape[1] * nfull
    # the same stages inside real prefills, alternating with DynamicCache prefills (ABBA)
    torch.set_num_threads(2)
    gaac_hf.register()
    import gaac_hf.cache.attention as att
    import transformers.integrations.sdpa_attention as sd
    from transformers.modeling_utils import AttentionInterface
    sdpa_timed = wrapped(sd.sdpa_attention_forward, "sdpa")
    AttentionInterface._global_mapping["sdpa"] = sdpa_timed
    att._sdpa = lambda: sdpa_timed
    AttentionInterface._global_mapping["gaac"] = wrapped(att.gaac_attention_forward, "gaac_attention")
    t_mod = {}

    def pre(name):
        def f(m, a, k=None):
            t_mod[name] = time.perf_counter()
        return f

    def post(name):
        def f(m, a, o, k=None):
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - t_mod[name]
        return f
    for lyr in model.model.layers:
        for name in ("self_attn", "mlp"):
            getattr(lyr, name).register_forward_pre_hook(pre(name))
            getattr(lyr, name).register_forward_hook(post(name))
    model_runs = {"dynamic": [], "gaac": []}
    for i in range(reps + 1):
        for kind in (("dynamic", "gaac") if i % 2 == 0 else ("gaac", "dynamic")):
            if kind == "gaac":
                model.set_attn_implementation("gaac")
                c = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
            else:
                model.set_attn_implementation("sdpa")
                c = DynamicCache(config=model.config)
            stages.clear()
            t = time.perf_counter()
            model(ids, past_key_values=c, use_cache=True, logits_to_keep=1)
            dt = time.perf_counter() - t
            del c
            if i:
                model_runs[kind].append({"prefill": dt, **stages})
                print(kind, json.dumps(model_runs[kind][-1]), flush=True)
med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
in_model = {kind: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for kind, rs in model_runs.items()}
print(json.dumps({"in_model": in_model, "ratio": in_model["gaac"]["prefill"] / in_model["dynamic"]["prefill"]}))
print(json.dumps({"context": context, "blocks": blocks, "median": med, "encode_kv_threads_s": one,
                  "us_per_block_1thread": 1e6 * one[1] / blocks}))
