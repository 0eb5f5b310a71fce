"""Building a paged K or V cache from dense tensors, for tests and benchmarks of the attention kernels.

:func:`pack_paged_kv` encodes complete blocks with the Triton encoder on CUDA and with the reference
codec elsewhere (the same bytes: ``tests/test_kernels_codec.py``; on the CPU Triton runs only through
its interpreter, where the encoder is the slow part of building a case) and lays them out as the cache does; :func:`paged_kv` pairs a K and a V into the
:class:`~gaac_hf.kernels.paged.PagedKV` that the attention kernels take.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gaac_hf.codec import encode_blocks, pack_escapes
from gaac_hf.format import BlockGeometry

from ..paged import PagedKV, PagedTensor
from .encode import encode_blocks_triton


@dataclass(frozen=True)
class PackedTensor:
    """One K or V packed by :func:`pack_paged_kv`: the paged tensor and what the caller may report."""

    tensor: PagedTensor
    geometry: BlockGeometry
    num_blocks: torch.Tensor  # int32 [B]
    tail_len: torch.Tensor  # int32 [B]
    max_blocks: int
    fits_fraction: float  # compressed share of the complete blocks
    escape_bytes: int  # bytes in the escape heap


def paged_kv(k: PackedTensor, v: PackedTensor, *, kv_start: torch.Tensor | None = None,
             active_blocks: int | None = None) -> PagedKV:
    """K and V (packed from the same ``seq_lens``) as one :class:`PagedKV`."""
    return PagedKV(k.tensor, v.tensor, k.num_blocks, k.tail_len, k.geometry, kv_start, active_blocks)


def pack_paged_kv(
    x: torch.Tensor,
    seq_lens: list[int],
    base8: torch.Tensor | None,
    base16: torch.Tensor | None,
    geometry: BlockGeometry,
    *,
    compress: bool = True,
    force_raw: torch.Tensor | None = None,
) -> PackedTensor:
    """Dense bf16 ``[B, Hkv, S, D]`` (sequence b valid in ``[:seq_lens[b]]``) -> one K or V paged cache.

    Complete blocks are encoded with the Triton encoder on CUDA, the reference codec elsewhere
    (``compress=False``: every block raw, the BF16 baseline's cache). Blocks that do not fit (``escape_limit``), and blocks where ``force_raw``
    (bool, one per complete block in (b, h, i) order) is set, go to the raw pool; the escape streams
    of the compressed ones are packed into one heap (``codec.pack_escapes``).
    Without bases (``compress=False``) the pool's bases are zeros (never read by the BF16 kernel).
    """
    B, H, S, D = x.shape
    T = geometry.block_size
    dev = x.device
    nbs = [n // T for n in seq_lens]
    maxb = max(1, max(nbs))
    # complete blocks in (b, h, i) order, one reshape per sequence
    blocks = [x[b, :, : nbs[b] * T].reshape(H * nbs[b], T, D) for b in range(B)]
    n = sum(H * nb for nb in nbs)
    table = torch.zeros(B, H, maxb, dtype=torch.int32, device=dev)
    tail = torch.zeros(B, H, T, D, dtype=torch.bfloat16, device=dev)
    for b in range(B):
        r = seq_lens[b] - nbs[b] * T
        tail[b, :, :r] = x[b, :, nbs[b] * T: seq_lens[b]]
    if n:
        blk = torch.cat(blocks)
        if compress:
            heads = torch.cat([torch.arange(H, device=dev).repeat_interleave(nb) for nb in nbs])
            encode = encode_blocks_triton if blk.is_cuda else encode_blocks  # byte-identical
            enc = encode(blk, base8[heads], base16[heads], geometry)
            fits = enc.fits.clone()
            if force_raw is not None:
                fits &= ~force_raw.to(dev)
        else:
            enc = None
            fits = torch.zeros(n, dtype=torch.bool, device=dev)
        slot_idx = torch.cumsum(fits.int(), 0) - 1
        raw_idx = torch.cumsum((~fits).int(), 0) - 1
        entry = torch.where(fits, slot_idx, -1 - raw_idx).to(torch.int32)
        slots = enc.slots[fits] if enc is not None else blk.new_zeros(0, geometry.slot_bytes, dtype=torch.uint8)
        if enc is not None:
            heap, esc_start = pack_escapes(enc.escapes[fits], enc.escape_len[fits])
        else:
            heap, esc_start = blk.new_zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64, device=dev)
        raw = blk[~fits]
        k = 0
        for b in range(B):
            table[b, :, : nbs[b]] = entry[k: k + H * nbs[b]].reshape(H, nbs[b])
            k += H * nbs[b]
        frac = float(fits.float().mean())
    else:
        slots = torch.zeros(0, geometry.slot_bytes, dtype=torch.uint8, device=dev)
        raw = torch.zeros(0, T, D, dtype=torch.bfloat16, device=dev)
        heap, esc_start = torch.zeros(0, dtype=torch.uint8, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
        frac = 0.0
    escape_bytes = heap.numel()
    if slots.shape[0] == 0:  # pools need one row for a valid pointer
        slots = torch.zeros(1, geometry.slot_bytes, dtype=torch.uint8, device=dev)
        esc_start = torch.zeros(1, dtype=torch.int64, device=dev)
    if heap.numel() == 0:
        heap = torch.zeros(1, dtype=torch.uint8, device=dev)
    if raw.shape[0] == 0:
        raw = torch.zeros(1, T, D, dtype=torch.bfloat16, device=dev)
    if base8 is None:
        base8 = base16 = torch.zeros(H, D, dtype=torch.uint8, device=dev)
    paged = PagedTensor(slots.contiguous(), heap.contiguous(), esc_start.contiguous(), raw.contiguous(), table, tail,
                        base8.contiguous(), base16.contiguous())
    return PackedTensor(
        paged, geometry,
        num_blocks=torch.tensor(nbs, dtype=torch.int32, device=dev),
        tail_len=torch.tensor([s - nb * T for s, nb in zip(seq_lens, nbs)], dtype=torch.int32, device=dev),
        max_blocks=maxb, fits_fraction=frac, escape_bytes=escape_bytes,
    )
