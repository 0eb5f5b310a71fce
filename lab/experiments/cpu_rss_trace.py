"""Resident memory through one CPU prefill + decode steps of SmolLM2, per cache kind (issue 16: why the GAAC
process's peak RSS was above DynamicCache's). Samples, at every cache update and attention call, the
process RSS (/proc/self/statm) and glibc's own counts (mallinfo2: bytes in use, free bytes held in the
heaps, mmapped bytes), and reports their maxima and where they happened.

    python lab/experiments/cpu_rss_trace.py KIND CONTEXT [--steps N] [--logits-to-keep 1]
"""
import argparse
import ctypes
import json
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "eval"))
import bench_cpu_decode as B  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import gaac_hf  # noqa: E402
import gaac_hf.cache.attention as att  # noqa: E402
from gaac_hf.models import load_smollm2  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
PAGE = os.sysconf("SC_PAGE_SIZE")
ap = argparse.ArgumentParser()
ap.add_argument("kind")
ap.add_argument("context", type=int)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--logits-to-keep", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(2)
model, tok = load_smollm2()
gaac_hf.register()
ids = B._tokens(tok, a.context)
peak = {"rss": (0, ""), "in_use": (0, ""), "free_held": (0, "")}
phase = ["load"]


def sample(where):
    rss = int(open("/proc/self/statm").read().split()[1]) * PAGE
    m = libc.mallinfo2()
    for key, val in (("rss", rss), ("in_use", m.uordblks + m.hblkhd), ("free_held", m.fordblks)):
        if val > peak[key][0]:
            peak[key] = (val, f"{phase[0]} {where}")


def wrap(fn, where):
    def w(*x, **k):
        sample(where + " before")
        try:
            return fn(*x, **k)
        finally:
            sample(where + " after")
    return w


import gaac_hf.cache.layer as L  # noqa: E402
import gaac_hf.cache.pool_v3 as PV  # noqa: E402
import gaac_hf.kernels.cpu.native as N  # noqa: E402

L.GAACLayer.update = wrap(L.GAACLayer.update, "gaac update")
N.pack_kv = wrap(N.pack_kv, "pack_kv")
PV.native.pack_kv = N.pack_kv
from transformers.cache_utils import DynamicLayer  # noqa: E402

DynamicLayer.update = wrap(DynamicLayer.update, "dynamic update")
import transformers.integrations.sdpa_attention as sd  # noqa: E402

AttentionInterface._global_mapping["sdpa"] = wrap(sd.sdpa_attention_forward, "sdpa")
AttentionInterface._global_mapping["gaac"] = wrap(att.gaac_attention_forward, "gaac attention")
sample("start")
base = dict(peak)
if a.kind == "gaac":
    model.set_attn_implementation("gaac")
    cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
else:
    model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=model.config) if a.kind == "dynamic" else None
with torch.no_grad():
    phase[0] = "prefill"
    out = model(ids, past_key_values=cache, use_cache=cache is not None, logits_to_keep=a.logits_to_keep)
    nxt = out.logits[:, -1:].argmax(-1)
    del out
    sample("prefill end")
    for i in range(a.steps):
        phase[0] = f"step {i}"
        out = model(nxt, past_key_values=cache, use_cache=cache is not None)
        nxt = out.logits[:, -1:].argmax(-1)
        del out
m = libc.mallinfo2()
print(json.dumps({"kind": a.kind, "context": a.context, "peak_mb": {k: (v[0] / 2**20, v[1]) for k, v in peak.items()},
                  "start_mb": {k: v[0] / 2**20 for k, v in base.items()},
                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "end_in_use_mb": (m.uordblks + m.hblkhd) / 2**20, "end_free_held_mb": m.fordblks / 2**20}))
