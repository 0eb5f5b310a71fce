"""Operators per decode step (a CPU proxy for CUDA kernels per graph replay), by where they come from.

On the H200 a graph-mode GAAC decode step's wall time is 1.09-1.21x its GPU time, and the replay span
equals the wall: the rest is gaps between ~1,000 kernels (lab/cuda-decode-notebook.md, session 13). This
counts, on the CPU, the ATen operators of one decode step of the Qwen3 architecture (random init, 2
layers, the bench's tiny config) that would each be a kernel on CUDA (views and metadata ops left out),
with a StaticCache written in place and with a GAACCache in graph mode, per layer and by module, so the
note can say whose kernels they are. Run: python lab/experiments/count_step_ops.py [--out FILE]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import bench_e2e  # noqa: E402

#: operators that launch nothing on CUDA (views, metadata, allocation-only)
VIEWS = {"aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::expand", "aten::slice",
         "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::t", "aten::permute",
         "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::alias", "aten::lift_fresh", "aten::detach",
         "aten::_unsafe_view", "aten::unbind", "aten::split", "aten::chunk", "aten::narrow", "aten::flatten",
         "aten::view_as", "aten::expand_as", "aten::resize_", "aten::set_", "aten::item", "aten::_local_scalar_dense",
         "aten::result_type", "aten::is_nonzero", "aten::size", "aten::stride", "aten::dim", "aten::to"}


def leaf_ops(fn):
    """Top-level-dispatched ATen ops of fn() that are not views (each a kernel on CUDA, roughly)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts = collections.Counter()

    def visit(ev):  # the outermost non-view op of each dispatch chain (a view-like op may hide a real copy)
        if ev.name not in VIEWS:
            counts[ev.name] += 1
        else:
            for child in ev.cpu_children:
                visit(child)

    for ev in prof.events():
        if ev.name.startswith("aten::") and (ev.cpu_parent is None or not ev.cpu_parent.name.startswith("aten::")):
            visit(ev)
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--prefill", type=int, default=192)
    args = ap.parse_args(argv)
    import gaac_hf
    from transformers import StaticCache

    dev = torch.device("cpu")
    model = bench_e2e.build_model(dev, tiny=True)
    table = bench_e2e.calibrate_random(model, dev, tokens=512)
    L = model.config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=g)
    nxt = torch.randint(0, model.config.vocab_size, (1, 1), generator=g)
    out = {"model": "qwen3 tiny config (bench_e2e.tiny_config), random init, bf16, CPU", "layers": L}

    # StaticCache written in place (what the e2e baseline runs), one token
    model.set_attn_implementation("sdpa")
    st = StaticCache(config=model.config, max_cache_len=args.prefill + 8)
    with torch.no_grad():
        model(ids, past_key_values=st)
        pos = torch.tensor([[args.prefill]])
        c_static = leaf_ops(lambda: model(nxt, past_key_values=st, position_ids=pos, logits_to_keep=1))

    # GAACCache in graph mode (the steps a graph captures), append kind
    gaac_hf.register()
    model.set_attn_implementation("gaac")
    from gaac_hf.integrations.cuda_graphs import DecodeGraphs

    from gaac_hf.cache import pool_v3

    pool_v3.CPU_SYNC_FREE = True  # device-offset placement, as on CUDA (what graph mode needs; the tests do the same)
    cache = gaac_hf.GAACCache(model.config, calibration=table, format_version=3)
    with torch.no_grad():
        model(ids, past_key_values=cache)
        runner = DecodeGraphs(model, cache, 16, capture=False)
        runner.step(nxt)  # warm
        c_gaac = leaf_ops(lambda: runner.step(nxt))
        runner.close()
    for name, c in (("static_cache", c_static), ("gaac_graph_mode", c_gaac)):
        out[name] = {"ops_per_step": sum(c.values()), "by_op": dict(c.most_common())}
        print(f"{name}: {sum(c.values())} ops per step ({sum(c.values()) / L:.1f} per layer incl. the head)")
        for op, n in c.most_common(12):
            print(f"   {n:4d} {op}")
    diff = c_gaac - c_static
    out["gaac_extra"] = dict(diff.most_common())
    print("GAAC graph mode minus StaticCache:", dict(diff.most_common()))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
