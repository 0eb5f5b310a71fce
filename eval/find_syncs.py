"""Where a GAACCache prefill synchronizes the host with the GPU (diagnostic; CUDA only).

    python eval/find_syncs.py [--context 4096] [--layers 4]

Runs one prefill of a random-init model with the Qwen3-8B attention shape (fewer layers) under
``torch.cuda.set_sync_debug_mode("warn")`` and prints every synchronizing call once, with the
Python stack that issued it and how often it happened. A sync inside a layer drains the GPU queue;
the GPU then idles while the host enqueues the next kernels (see lab/NOTES.md, prefill overhead).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_e2e as E  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("find_syncs needs a CUDA device (sync debug mode is a CUDA feature)")
    import gaac_hf
    from transformers import AutoModelForCausalLM

    dev = torch.device("cuda")
    cfg = E.qwen3_8b_config()
    cfg.num_hidden_layers = args.layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[: args.layers]
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    table = E.calibrate_random(model, dev, tokens=1024)
    gaac_hf.register()
    model.set_attn_implementation("gaac")
    ids = torch.randint(0, cfg.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0)).to(dev)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, gaac_hf.GAACCache(model.config, calibration=table)), logits_to_keep=1)  # warm-up
    torch.cuda.synchronize()
    seen = collections.Counter()
    stacks = {}

    def show(message, category, filename, lineno, file=None, line=None):
        st = "".join(traceback.format_stack()[:-2][-9:])
        key = (str(message)[:80], st)
        seen[key] += 1
        stacks[key] = st

    old = warnings.showwarning
    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with torch.no_grad():
            cache = gaac_hf.GAACCache(model.config, calibration=table)
            model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    print(f"{sum(seen.values())} synchronizing calls in one {args.layers}-layer prefill of {args.context} tokens")
    for (msg, _), n in seen.most_common():
        print(f"--- {n} x {msg}")
        print(stacks[(msg, _)])


if __name__ == "__main__":
    main()
