"""Host (Python/dispatcher) time of the GAAC decode step's cache-side pieces, measured on the CPU.

No GPU, no model weights: a GAACCache over a synthetic calibration table for a Qwen3-8B-shaped
model (36 layers, 8 kv-heads, head_dim 128) is prefilled with random BF16 K/V, then decode steps
(q_len 1) are timed per layer call:

* ``update``: ``GAACLayer.update`` (tail-carrier mode) on steps where no block completes, and on the
  steps where one does (encode + pool append: the reference codec on the CPU, the Triton codec on
  CUDA, so that number is dominated by the codec, not by launch overhead), plus the wall time of each
  block-completing step (all layers, synced);
* ``paged_kv``: ``GAACLayer.paged_kv()`` of every layer of a step;
* ``launcher``: ``gaac_decode_attention(q, layer.paged_kv())`` with the two Triton kernels
  replaced by no-op stubs, i.e. the Python prologue of the launcher only.

CPU torch ops cost less host time than CUDA ones (no cudaLaunchKernel), so read the numbers as a
relative before/after check of the Python paths, not as GPU-step predictions. ``--device cuda``
runs the same loops on a GPU (Triton codec) and adds the host time of the real launch
(``gaac_decode_attention`` with its kernels, no sync inside the timed loop).

    python eval/host_overhead_cpu.py [--prefill 4096] [--steps 128] [--layers 36] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch  # noqa: E402
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the launcher's module imports Triton kernels


def make_cache(layers: int, kv_heads: int, head_dim: int, block: int):
    from transformers import LlamaConfig

    from gaac_hf import GAACCache
    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.format import BlockGeometry

    cfg = LlamaConfig(num_hidden_layers=layers, num_attention_heads=4 * kv_heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, hidden_size=4 * kv_heads * head_dim, vocab_size=128)
    shape = (layers, 2, kv_heads, head_dim)
    # N(0, 1) BF16 exponents sit around 127: windows [123, 131) and [119, 135)
    table = CalibrationTable(torch.full(shape, 123, dtype=torch.uint8), torch.full(shape, 119, dtype=torch.uint8),
                             BlockGeometry(block_size=block, head_dim=head_dim))
    return cfg, GAACCache(cfg, calibration=table, return_full_kv=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--launcher-iters", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    h, d = args.kv_heads, args.head_dim
    cfg, cache = make_cache(args.layers, h, d, args.block)
    layers = cache.layers
    dev = torch.device(args.device)
    kv = lambda q: torch.randn(1, h, q, d, device=dev).to(torch.bfloat16)  # noqa: E731
    for layer in layers:
        layer.update(kv(args.prefill), kv(args.prefill))
        layer._awaiting_attention, layer._recent = False, None
    steps = [kv(1) for _ in range(8)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()

    upd_plain, upd_fill, views, fill_steps = [], [], [], []
    for s in range(args.steps):
        k = v = steps[s % len(steps)]
        fills = layers[0].tail_len + 1 == args.block
        ts = time.perf_counter()
        for layer in layers:
            t0 = time.perf_counter()
            layer.update(k, v)
            t1 = time.perf_counter()
            layer.paged_kv()
            t2 = time.perf_counter()
            layer._awaiting_attention, layer._recent = False, None  # what the attention call does
            (upd_fill if fills else upd_plain).append(t1 - t0)
            views.append(t2 - t1)
        if fills:
            sync()  # keep the encode work of a fill out of the next step's timings
            fill_steps.append(time.perf_counter() - ts)

    import gaac_hf.kernels.attention as A

    layer = layers[0]
    q = torch.randn(1, 4 * h, d, device=dev).to(torch.bfloat16)
    real = {}
    if dev.type == "cuda":  # the real launch: host time per call (the GPU runs behind)
        for _ in range(50):
            A.gaac_decode_attention(q, layer.paged_kv(), scale=d ** -0.5)
        sync()
        n = args.launcher_iters
        t0 = time.perf_counter()
        for _ in range(n):
            A.gaac_decode_attention(q, layer.paged_kv(), scale=d ** -0.5)
        t1 = time.perf_counter()
        sync()
        real = {"launch_us_host (gaac_decode_attention(layer.paged_kv()), real kernels)": round((t1 - t0) / n * 1e6, 2)}

    # launcher prologue with the kernels stubbed out
    class _Stub:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    saved = A._attn_split_kernel, A._merge_kernel
    A._attn_split_kernel = A._merge_kernel = _Stub()
    try:
        for _ in range(50):
            A.gaac_decode_attention(q, layer.paged_kv(), scale=d ** -0.5)
        t0 = time.perf_counter()
        for _ in range(args.launcher_iters):
            A.gaac_decode_attention(q, layer.paged_kv(), scale=d ** -0.5)
        launch_us = (time.perf_counter() - t0) / args.launcher_iters * 1e6
        view = layer.paged_kv()
        t0 = time.perf_counter()
        for _ in range(args.launcher_iters):
            A.gaac_decode_attention(q, view, scale=d ** -0.5)
        launch_prepared_us = (time.perf_counter() - t0) / args.launcher_iters * 1e6
    finally:
        A._attn_split_kernel, A._merge_kernel = saved

    us = lambda xs: round(statistics.median(xs) * 1e6, 2)  # noqa: E731
    res = {
        "shape": dict(layers=args.layers, kv_heads=h, head_dim=d, block=args.block, prefill=args.prefill,
                      steps=args.steps, device=str(dev), torch=torch.__version__, threads=torch.get_num_threads()),
        "update_us_median_no_fill": us(upd_plain),
        "update_us_median_block_fill (codec work included)": us(upd_fill) if upd_fill else None,
        "block_fill_step_ms (all layers' update + sync; first fill after the prefill first)":
            [round(x * 1e3, 2) for x in fill_steps],
        "kernel_view_us_median": us(views),
        "kernel_view_us_mean": round(statistics.fmean(views) * 1e6, 2),
        "launcher_prologue_us (gaac_decode_attention(layer.paged_kv()), kernels stubbed)": round(launch_us, 2),
        "launcher_prologue_us (prepared view, kernels stubbed)": round(launch_prepared_us, 2),
        **real,
        "stats_allocated_bytes": cache.stats()["allocated_bytes"],
        "stats_resident_bytes": cache.stats()["resident_bytes"],
    }
    print(json.dumps(res, indent=1))
    if args.out:
        harness.write_result(args.out, res)


if __name__ == "__main__":
    main()
