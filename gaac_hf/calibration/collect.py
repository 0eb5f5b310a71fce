"""Collect post-RoPE K/V exponent statistics from a transformers model running over text.

The model runs forward on consecutive, non-overlapping chunks of ``context`` tokens (each chunk is
one independent sequence starting at position 0, as a prompt of that length would be) with a
:class:`transformers.DynamicCache`. After each chunk, ``cache.layers[i].keys`` / ``.values``
(``[B, Hkv, S, D]`` BF16, keys already rotated) are folded into per-(layer, K/V, kv-head, channel)
exponent histograms. Optionally:

* per-position-range histograms (``position_ranges``), to see how key exponents drift with position;
* the raw exponent fields of the first chunks (``keep_tokens``), from which
  :func:`gaac_hf.calibration.calibrate` measures group modes and escape bytes per block once the
  windows are known (modes depend on 8 values jointly, so histograms alone cannot give them).

Sliding-window layers (e.g. Gemma 3) keep only their last tokens in the cache; their values are
counted at their true positions (the last ``S`` positions of the chunk).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..codec import decode_tensor, encode_tensor
from ..models import cache_keyword
from .statistics import exponent_histogram
from .table import model_kv_shape


def default_position_ranges(context: int) -> list[tuple[int, int]]:
    """0-1K, 1-2K, 2-4K, 4-8K, 8-16K, ... up to ``context`` (a shorter context gets one range)."""
    if context <= 1024:
        return [(0, context)]
    edges = [0, 1024]
    while edges[-1] < context:
        edges.append(min(edges[-1] * 2, context))
    return list(zip(edges[:-1], edges[1:]))


def range_label(r: tuple[int, int]) -> str:
    def k(n: int) -> str:
        return f"{n // 1024}K" if n % 1024 == 0 and n else str(n)

    return f"{k(r[0])}-{k(r[1])}"


@dataclass
class KVStats:
    """What :func:`collect_kv_stats` saw.

    hist: int64 ``[L, 2, Hkv, D, 256]`` exponent histograms (dim 1: 0 = keys, 1 = values).
    range_hist: int64 ``[R, L, 2, Hkv, D, 256]`` the same per position range, or None.
    exponents: list (one per kept chunk) of uint8 ``[L, 2, Hkv, context, D]`` exponent fields. A
        layer whose cache holds only its last ``S < context`` tokens (sliding window) has them at
        the end, zeros before (see ``layer_lengths``).
    layer_lengths: tokens each layer's cache held per chunk (``context`` unless sliding-window).
    """

    hist: torch.Tensor
    context: int
    chunks: int
    tokens: int
    position_ranges: list[tuple[int, int]]
    range_hist: torch.Tensor | None = None
    exponents: list[torch.Tensor] = field(default_factory=list)
    layer_lengths: list[int] = field(default_factory=list)

    @property
    def kept_tokens(self) -> int:
        return len(self.exponents) * self.context


def tokenize(tokenizer, text: str, max_tokens: int | None = None) -> torch.Tensor:
    """Text -> int64 ``[N]`` token ids (clear error on empty text)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("calibration text is empty: pass a file or string with some text in it")
    if max_tokens is not None and max_tokens > 0:
        # tokenize a generous prefix first: a 1 MB file need not be tokenized for 8K tokens
        guess = max_tokens * 16
        if guess < len(text):
            ids = tokenizer(text[:guess], return_tensors="pt", verbose=False).input_ids[0]
            if ids.numel() > max_tokens:
                return ids[:max_tokens]
    ids = tokenizer(text, return_tensors="pt", verbose=False).input_ids[0]
    return ids[:max_tokens] if max_tokens else ids


def _check_model_dtype(model) -> None:
    dtype = getattr(model, "dtype", None)
    if dtype != torch.bfloat16:
        raise TypeError(
            f"GAAC compresses bfloat16 KV caches, but the model runs in {dtype}: "
            "load it with dtype=torch.bfloat16 (or call model.to(torch.bfloat16))"
        )


def exponent_field(x: torch.Tensor) -> torch.Tensor:
    """BF16 tensor -> uint8 exponent fields, same shape."""
    return ((x.view(torch.int16).to(torch.int32) >> 7) & 0xFF).to(torch.uint8)


def split_chunks(ids: torch.Tensor, context: int, block_size: int = 1) -> torch.Tensor:
    """int64 ``[N]`` -> ``[chunks, context]``; raises if there is not one full chunk."""
    if context < block_size or context % block_size:
        raise ValueError(f"context ({context}) must be a positive multiple of block_size ({block_size})")
    n = ids.numel() // context
    if n == 0:
        fit = ids.numel() // block_size * block_size
        smaller = f" or --context {fit} (the most this text fills)" if fit else ""
        raise ValueError(
            f"the calibration text has {ids.numel()} tokens but one context needs {context}: "
            f"give at least {context} tokens of text{smaller}"
        )
    return ids[: n * context].reshape(n, context)


@torch.no_grad()
def run_chunks(
    model, chunks: torch.Tensor, *, batch_size: int = 1, progress: bool = True, desc: str = "forward", full_cache: bool = False
):
    """Yield ``(chunk_index, keys, values)`` per chunk: lists over layers of BF16 ``[Hkv, S_l, D]``.

    Each chunk is one sequence from position 0. Runs ``batch_size`` chunks per forward.
    full_cache: a cache without the model config, so sliding-window layers keep every token too
        (attention masks still follow the config).
    """
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    _check_model_dtype(model)
    kw = cache_keyword(model)
    dev = next(model.parameters()).device
    bar = tqdm(total=chunks.shape[0], desc=desc, unit="chunk", disable=not progress)
    for start in range(0, chunks.shape[0], batch_size):
        batch = chunks[start : start + batch_size].to(dev)
        cache = DynamicCache() if full_cache else DynamicCache(config=model.config)
        model(input_ids=batch, use_cache=True, logits_to_keep=1, **{kw: cache})
        for b in range(batch.shape[0]):
            keys, values = [], []
            for layer in cache.layers:
                k, v = layer.keys[b], layer.values[b]
                if k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16:
                    raise TypeError(f"the cache holds {k.dtype} K/V; GAAC needs bfloat16")
                keys.append(k)
                values.append(v)
            yield start + b, keys, values
        del cache
        bar.update(batch.shape[0])
    bar.close()


def collect_kv_stats(
    model,
    tokenizer,
    text: str,
    *,
    context: int = 8192,
    max_tokens: int | None = None,
    position_ranges: list[tuple[int, int]] | None = None,
    keep_tokens: int = 0,
    block_size: int = 1,
    batch_size: int = 1,
    progress: bool = True,
    full_cache: bool = False,
) -> KVStats:
    """Run ``model`` over ``text`` in chunks of ``context`` tokens and histogram K/V exponents.

    Args:
        context: tokens per forward (calibrate at the length you deploy: keys drift with position).
        max_tokens: use at most this many tokens of the text (whole chunks only).
        position_ranges: ``[(start, stop), ...]`` positions to histogram separately; default
            :func:`default_position_ranges`; ``[]`` for none.
        keep_tokens: keep the exponent fields of the first ``ceil(keep_tokens / context)`` chunks.
        block_size: the context must be a multiple of it.
        full_cache: see :func:`run_chunks` (statistics for sliding-window layers over all positions).
    """
    _check_model_dtype(model)
    shape = model_kv_shape(model.config)
    ids = tokenize(tokenizer, text, max_tokens)
    chunks = split_chunks(ids, context, block_size)
    if position_ranges is None:
        position_ranges = default_position_ranges(context)
    for a, b in position_ranges:
        if not 0 <= a < b <= context:
            raise ValueError(f"position range {(a, b)} is not inside [0, {context})")
    n_keep = -(-keep_tokens // context) if keep_tokens > 0 else 0

    L, H, D = shape["num_layers"], shape["num_kv_heads"], shape["head_dim"]
    hist = torch.zeros(L, 2, H, D, 256, dtype=torch.int64)
    rhist = torch.zeros(len(position_ranges), L, 2, H, D, 256, dtype=torch.int64) if position_ranges else None
    kept: list[torch.Tensor] = []
    lengths: list[int] = []
    for ci, keys, values in run_chunks(
        model, chunks, batch_size=batch_size, progress=progress, desc="calibration forward", full_cache=full_cache
    ):
        if len(keys) != L or keys[0].shape[0] != H or keys[0].shape[-1] != D:
            raise ValueError(f"cache shape {tuple(keys[0].shape)} x {len(keys)} layers does not match the config {shape}")
        lengths = [k.shape[1] for k in keys]
        ex = torch.zeros(L, 2, H, context, D, dtype=torch.uint8) if ci < n_keep else None
        for li in range(L):
            kv = torch.stack([keys[li], values[li]]).cpu()  # [2, H, S_l, D]
            s = kv.shape[2]
            hist[li] += exponent_histogram(kv)
            if rhist is not None:
                first = context - s  # sliding-window layers hold the last s positions
                for ri, (a, b) in enumerate(position_ranges):
                    lo, hi = max(a - first, 0), max(b - first, 0)
                    if hi > lo:
                        rhist[ri, li] += exponent_histogram(kv[:, :, lo:hi])
            if ex is not None:
                ex[li, :, :, context - s :] = exponent_field(kv)
        if ex is not None:
            kept.append(ex)
    return KVStats(
        hist=hist,
        context=context,
        chunks=chunks.shape[0],
        tokens=chunks.numel(),
        position_ranges=list(position_ranges),
        range_hist=rhist,
        exponents=kept,
        layer_lengths=lengths,
    )


def roundtrip(x: torch.Tensor, table, layer_idx: int, kind: int, geometry=None):
    """Encode one layer's K (kind=0) or V (kind=1) ``[Hkv, S, D]`` with the reference codec, decode
    it, and compare bits. Returns ``(EncodedTensor, bit_exact)``."""
    b8, b16 = table.bases(layer_idx, kind)
    enc = encode_tensor(x, b8, b16, geometry or table.geometry)
    dec = decode_tensor(enc, b8, b16)
    return enc, torch.equal(dec.view(torch.int16), x.view(torch.int16))
