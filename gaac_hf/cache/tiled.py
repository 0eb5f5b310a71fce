"""Attention over a format v3 layer on the CPU: decode steps and short chunks, tile by tile.

:func:`tiled_attention` serves ``gaac_attention_forward`` for v3 layers whose tensors are on the CPU
when the query has at most :data:`TILED_MAX_QUERY` tokens: the C++ library of
:mod:`gaac_hf.kernels.cpu` decodes each block (one tile of T tokens) of each kv-head into a small
buffer and attends to it with online softmax, over splits of :data:`SPLIT_TILES` tiles on
``torch.get_num_threads()`` threads; the whole BF16 K/V is never built. Its arithmetic is
:func:`gaac_hf.kernels.cpu.reference.tiled_attention_reference` (float32, fixed order), bit for bit;
without a compiler that reference itself runs on the decoded K/V (same bits, slower; warned once).
Outputs are within BF16 rounding of SDPA's, not bit-identical to them, so it runs only with
``GAACCache(fused=True)``: the CPU default (``fused=None``) and ``fused=False`` decode the blocks and run
SDPA on them (bit-identical to DynamicCache + sdpa).
"""
from __future__ import annotations

import math

import torch

from ..kernels.cpu import native
from ..kernels.cpu.reference import tiled_attention_reference
from .calls import plain_call

#: queries with more tokens than this (prefills) take SDPA on the decoded K/V, which for a prefill is
#: the uncompressed input itself (nothing decoded)
TILED_MAX_QUERY = 128
#: tiles (blocks) per split: ~1K tokens at the default block size, so 4K tokens of 3 kv-heads are 12
#: work items for the threads. Part of the arithmetic: the reference cuts the same splits.
SPLIT_TOKENS = 1024

# attention kwargs the tiled path does not implement: their presence means SDPA on the decoded K/V

# (mask, version, uint8 [B, Sq, L]) of the last mask: transformers hands every layer of a step the same one
_MASK_MEMO: list = [None]


def split_tiles(block_size: int) -> int:
    return max(SPLIT_TOKENS // block_size, 1)


def _mask_u8(mask: torch.Tensor) -> torch.Tensor:
    memo = _MASK_MEMO[0]
    if memo is not None and memo[0] is mask and memo[1] == mask._version:
        return memo[2]
    m = mask[:, 0].to(torch.uint8).contiguous()
    _MASK_MEMO[0] = (mask, mask._version, m)
    return m


def takes(layer, query: torch.Tensor, attention_mask, training_dropout: bool, kwargs: dict) -> bool:
    """Whether this call takes :func:`tiled_attention`."""
    if query.is_cuda or getattr(layer, "format_version", 2) != 3 or not layer.fused or training_dropout:
        return False
    if query.shape[2] > TILED_MAX_QUERY or query.device.type != "cpu" or query.dtype != torch.bfloat16:
        return False
    return plain_call(layer, query, attention_mask, kwargs)


def tiled_attention(query: torch.Tensor, layer, attention_mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Attention of ``query`` BF16 ``[B, Hq, Sq, D]`` over every token of the v3 ``layer`` (this step's
    included). ``attention_mask``: None (bottom-right causal) or bool ``[B, 1, Sq, kv_len]``.
    Returns BF16 ``[B, Sq, Hq, D]`` contiguous."""
    g = layer.geometry
    scale = scaling if scaling is not None else 1.0 / math.sqrt(g.head_dim)
    mask = None if attention_mask is None else _mask_u8(attention_mask)
    tiles = split_tiles(g.block_size)
    if native.available():
        kv = layer.paged_kv()
        return native.attention_v3(query, kv, (layer._pools[0].used, layer._pools[1].used), scale, tiles, mask)
    k, v = layer.full_kv()
    return tiled_attention_reference(query, k, v, scale, g.block_size, tiles, mask)
