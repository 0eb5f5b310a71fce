"""What the cache hands to an attention kernel: one paged, compressed K/V layer (:class:`PagedKV`),
and the launch knobs kernels take (:class:`LaunchConfig`).

This module needs only torch: every kernel backend (``kernels/triton`` today, ``kernels/cuda``
next) consumes the same object, and ``gaac_hf.cache`` builds it without importing any backend.

Per layer, K and V each are one :class:`PagedTensor`::

    slots      uint8 [num_slots, geometry.slot_bytes]   compressed blocks' planes (codec slot layout)
    heap       uint8 [M]                                 escape heap: the blocks' escape streams (M >= 1)
    esc_start  int64 [num_slots]                         offset of slot e's escape stream in the heap
    raw        bf16  [num_raw, T, D]                     blocks stored uncompressed (raw fallback, >= 1 row)
    table      int32 [B, Hkv, max_blocks]                one entry per complete block of each (seq, kv-head)
    tail       bf16  [B, Hkv, T, D]                      the incomplete last block, uncompressed
    base8/16   uint8 [Hkv, D]                            calibrated window starts of this layer and kind

and K and V share (:class:`PagedKV`)::

    num_blocks int32 [B]   complete blocks per sequence (entries table[b, :, :num_blocks[b]] are valid)
    tail_len   int32 [B]   valid tokens in tail[b] (0 <= tail_len <= T)
    kv_start   int32 [B]   optional: positions < kv_start[b] are masked out (left padding)

Block-table entries: ``e = table[b, h, i]``; ``e >= 0``: the block is compressed in ``slots[e]``;
``e < 0``: it is raw in ``raw[~e]`` (``-1 - e``). Token ``i*T + t`` of sequence b is token t of
block i; tail token t is position ``num_blocks[b]*T + t``; a sequence holds ``num_blocks*T +
tail_len`` tokens. K and V have separate tables because a K block and its V block fit or overflow
independently. Entries past ``num_blocks`` are never read, and a pool row only when a table points
at it. ``active_blocks`` (host int, optional) is an upper bound on ``num_blocks`` that sizes a
split grid; without it kernels size it from ``max_blocks`` (a fixed launch shape for CUDA graphs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gaac_hf.format import BlockGeometry
from gaac_hf.format.v3 import GeometryV3
from gaac_hf.format.v4 import GeometryV4


@dataclass(frozen=True)
class PagedTensor:
    """One kind (K or V) of one layer of a paged GAAC cache (shapes in the module docstring)."""

    slots: torch.Tensor
    heap: torch.Tensor
    esc_start: torch.Tensor
    raw: torch.Tensor
    table: torch.Tensor
    tail: torch.Tensor
    base8: torch.Tensor
    base16: torch.Tensor

    @classmethod
    def raw_only(cls, raw: torch.Tensor, table: torch.Tensor, tail: torch.Tensor, geometry: BlockGeometry) -> "PagedTensor":
        """An uncompressed paged cache (every table entry < 0): the BF16 baseline's input. The slot
        pool, heap and bases are one-row placeholders that a kernel never reads."""
        dev, u8 = raw.device, torch.uint8
        heads = table.shape[1]
        return cls(torch.zeros(1, geometry.slot_bytes, dtype=u8, device=dev), torch.zeros(1, dtype=u8, device=dev),
                   torch.zeros(1, dtype=torch.int64, device=dev), raw, table, tail,
                   torch.zeros(heads, geometry.head_dim, dtype=u8, device=dev),
                   torch.zeros(heads, geometry.head_dim, dtype=u8, device=dev))


@dataclass(frozen=True)
class PagedTensorV3:
    """One kind (K or V) of one layer stored in format v3 (``docs/FORMAT_V3.md``)::

        pool    uint8 [P]                  v3 blocks at 16-byte aligned offsets (P >= GUARD_BYTES past
                                           the end of the last block: vector loads may read up to
                                           GUARD_BYTES beyond a block's last byte, never past P)
        table   int64 [B, Hkv, max_blocks] block-table entries: byte offset in ``pool`` | ENTRY_RAW (1)
                                           when the block is stored as BF16 (row-major [T, D], 2*T*D bytes)
        tail    bf16  [B, Hkv, T, D]       the incomplete last block, uncompressed
        b8p     int32 [Hkv, D/2]           pre-shifted base8 pair constants (core.cuh ``pair_const``)
        dbp     int32 [Hkv, D/2]           pre-shifted (base16 - base8) mod 256 pair constants

    Build with :meth:`from_bases` from the layer's uint8 ``base8`` / ``base16`` ``[Hkv, D]``.
    """

    GUARD_BYTES = 256

    pool: torch.Tensor
    table: torch.Tensor
    tail: torch.Tensor
    b8p: torch.Tensor
    dbp: torch.Tensor

    @staticmethod
    def pair_constants(base8: torch.Tensor, base16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(b8p, dbp) int32 ``[..., D/2]`` from uint8 bases ``[..., D]``: channel 2p's 8 bits at bits
        7-14, channel 2p+1's at bits 23-30 (the exponent fields of a BF16 pair word)."""
        b8, b16 = base8.to(torch.int64), base16.to(torch.int64)
        pc = lambda v: ((v[..., 0::2] & 0xFF) << 7) | ((v[..., 1::2] & 0xFF) << 23)  # noqa: E731
        to32 = lambda v: (v - ((v >> 31) << 32)).to(torch.int32).contiguous()  # noqa: E731
        return to32(pc(b8)), to32(pc((b16 - b8) & 0xFF))

    @classmethod
    def from_bases(cls, pool, table, tail, base8: torch.Tensor, base16: torch.Tensor) -> "PagedTensorV3":
        b8p, dbp = cls.pair_constants(base8.to(pool.device), base16.to(pool.device))
        return cls(pool, table, tail, b8p, dbp)


@dataclass(frozen=True)
class PagedTensorV4:
    """One kind (K or V) of one layer stored in format v4 (``gaac_hf/format/v4.py``): the v3 pool's
    addressing with fixed-size blocks of 16-token register tiles::

        pool    uint8 [P]                  v4 blocks (``block_bytes``) or BF16 blocks (2*T*D bytes) at 16-byte
                                           aligned offsets, at least GUARD_BYTES readable bytes past the last
        table   int64 [B, Hkv, max_blocks] byte offset in ``pool`` | ENTRY_RAW (1) for a block stored as BF16
        tail    bf16  [B, Hkv, T, D]       the incomplete last block, uncompressed
        base16  uint8 [Hkv, D]             the calibrated windows of this layer and kind
        kind    "k" or "v"                 the lane mapping its tiles were laid out with (K and V differ)
    """

    GUARD_BYTES = 256

    pool: torch.Tensor
    table: torch.Tensor
    tail: torch.Tensor
    base16: torch.Tensor
    kind: str


@dataclass(frozen=True)
class PagedKV:
    """One layer's K and V as attention kernels read them (shapes in the module docstring). K and V
    are both :class:`PagedTensor` with a v2 :class:`BlockGeometry`, or both :class:`PagedTensorV3`
    with a :class:`GeometryV3`, or both :class:`PagedTensorV4` with a :class:`GeometryV4`;
    ``num_blocks`` / ``tail_len`` / ``kv_start`` mean the same in all."""

    k: PagedTensor | PagedTensorV3 | PagedTensorV4
    v: PagedTensor | PagedTensorV3 | PagedTensorV4
    num_blocks: torch.Tensor
    tail_len: torch.Tensor
    geometry: BlockGeometry | GeometryV3 | GeometryV4
    kv_start: torch.Tensor | None = None
    active_blocks: int | None = None

    @property
    def format_version(self) -> int:
        if isinstance(self.k, PagedTensorV4):
            return 4
        return 3 if isinstance(self.k, PagedTensorV3) else 2


@dataclass(frozen=True)
class LaunchConfig:
    """Launch knobs of a kernel; ``None`` means the kernel's own default. Any values give a correct
    result; for the attention kernels bit identity with the BF16 twin is per configuration (tile and
    split sizes change the accumulation order), for the codec kernels the bits never change.

    num_splits: context splits per (sequence, kv-head) of a split-K attention kernel.
    num_warps, num_stages, maxnreg: passed to the compiler (CUDA kernels: warps per CTA, depth of each
    warp's copy ring; maxnreg is Triton's).
    tile_tokens: tokens per sub-tile (rows decoded at once; Triton kernels).
    ctas_per_sm: CUDA kernels: resident CTAs per SM the grid is sized for (also their register cap).
    loader: CUDA kernels: "cp.async" (16 B per lane) or "bulk" (the copy engine, a row per lane).
    producer_segments: the fused CUDA kernel: segments (1,024 values) of K and of V each producer
    warp decodes per tile (1 or 2; fewer means more producer warps).
    producer_kinds: the fused CUDA kernel: 2 = a producer warp decodes K and V of its segments, 1 = one
    producer for each (twice the producers, each with half the look-ups and copies).
    decoded_k_slots: the fused CUDA kernel: slots of each consumer's decoded K ring (2, or 1: the
    consumer frees K once S is computed, so the ring takes less shared memory and more CTAs fit).
    decoded_slots: the fused CUDA kernel: slots of each consumer's decoded V ring (and of K's unless
    decoded_k_slots is 1); 2 by default.
    merge_chunk: CUDA split-KV kernels: splits per first-level chunk of the in-kernel merge (0: every split
    merged by the last CTA alone; default: chunks of 16 where that CTA would read over 128 KiB).
    """

    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tile_tokens: int | None = None
    maxnreg: int | None = None
    ctas_per_sm: int | None = None
    loader: str | None = None
    producer_segments: int | None = None
    producer_kinds: int | None = None
    decoded_k_slots: int | None = None
    decoded_slots: int | None = None
    merge_chunk: int | None = None


DEFAULT_LAUNCH = LaunchConfig()
