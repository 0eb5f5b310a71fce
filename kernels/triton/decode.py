"""Triton standalone GAAC decoder: slots + escape heap -> BF16 blocks, bit-identical to the reference.

Reference: ``gaac_hf.codec.decode_blocks`` (with validate=False: this kernel never syncs with the host;
it reproduces the reference's output bit for bit also on slots that validation would reject). Used by
the reference attention path and for transfer/offload; the fused attention kernel calls the same
device helper (``_tile.decode_block_bits``) per tile instead of materializing BF16.

One program decodes one block; the tile is ``[T, Q, 4, 8]`` (see ``_tile.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gaac_hf.codec import escape_source
from gaac_hf.format import BlockGeometry

from ..paged import DEFAULT_LAUNCH, LaunchConfig, PagedTensor
from ._tile import base_pair_words, decode_block_bits, decode_rows_pairs, pairs_to_tile, row_offsets, tile_index
from .encode import _bases, _check_geometry


@triton.jit
def _fast_block(dst, slot, stream, B8, B16, h, rowoff, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr,
                TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr, TS: tl.constexpr):
    """One fitting block (slot, its escape ``stream``, bases row ``h`` of ``B8``/``B16``) -> int16
    ``[T, D]`` rows at ``dst``, in sub-tiles of TS rows with the attention kernel's pair decoder
    (``rowoff``: this program's int16 ``[T]`` scratch for the block's row offsets)."""
    a0, a1, a2, a3 = base_pair_words(B8, h, D)
    c0, c1, c2, c3 = base_pair_words(B16, h, D)
    has_raw = row_offsets(slot, rowoff, TAG_OFF, T, D)
    r = tl.arange(0, TS)[:, None]
    c = tl.arange(0, D)[None, :]
    # Stored as an int16 tile: one layout conversion through shared memory, then 16-byte coalesced row
    # stores. Storing the 4 pair words of each group directly (4 strided 4-byte stores) was slower on
    # the H200: 1,290 vs 1,635 GB/s at d=128 (lab/results/superseded/codec_h200_{words,defaults}.json).
    for sub in tl.static_range(T // TS):
        w0, w1, w2, w3 = decode_rows_pairs(slot, stream, rowoff, sub * TS, has_raw, a0, a1, a2, a3, c0, c1, c2, c3,
                                           LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
        tl.store(dst + (sub * TS + r) * D + c, pairs_to_tile(w0, w1, w2, w3, TS, D))


# Row-offset scratch of the fast decoders (``_tile.row_offsets``: int16 [programs, T]), kept per
# (device, stream) and grown when too small: the decode-then-SDPA path calls the table decoder once per
# layer and step, and an allocation there is host time. Reuse is safe in stream order (a launch's
# programs are done with their rows before the next launch on that stream starts); calls made while a
# CUDA graph is being captured allocate their own.
_ROW_SCRATCH: dict = {}


def _row_scratch(numel: int, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.empty(numel, dtype=torch.int16, device=device)
        idx = device.index if device.index is not None else torch.cuda.current_device()
        key = (idx, torch._C._cuda_getCurrentRawStream(idx))
    else:
        key = (device.type, device.index)
    buf = _ROW_SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        if buf is None and len(_ROW_SCRATCH) >= 32:
            _ROW_SCRATCH.clear()
        buf = _ROW_SCRATCH[key] = torch.empty(max(numel, 4096), dtype=torch.int16, device=device)
    return buf


@triton.jit
def _decode_kernel(
    SLOTS,  # *uint8 [N, SLOT_BYTES]
    HEAP,  # *uint8 [M]: escape heap
    ESC_START,  # *int64 [N]: each block's stream offset in HEAP
    heap_len,  # M
    B8,  # *uint8 [N or 1, D]
    B16,
    OUT,  # *int16 [N, T, D]
    ROWOFF,  # *int16 [N, T]: scratch of the fast path (row offsets)
    base_stride,
    SLOT_BYTES: tl.constexpr,
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    FAST: tl.constexpr,
    TS: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    esc0 = tl.load(ESC_START + n)
    if FAST:  # attention's pair decoder, whole block in sub-tiles of TS rows
        _fast_block(OUT + n * (T * D), SLOTS + n * SLOT_BYTES, HEAP + esc0, B8 + n * base_stride,
                    B16 + n * base_stride, 0, ROWOFF + n * T, LO2_OFF, HI1_OFF, TAG_OFF, T, D, TS)
    else:
        grp, elem, chan, t, q, i, j = tile_index(T, D)
        b8 = tl.load(B8 + n * base_stride + chan).to(tl.int32)
        b16 = tl.load(B16 + n * base_stride + chan).to(tl.int32)
        bits = decode_block_bits(SLOTS + n * SLOT_BYTES, HEAP, esc0, heap_len, b8, b16, LO2_OFF, HI1_OFF, TAG_OFF, T, D)
        tl.store(OUT + n * (T * D) + elem, bits.to(tl.int16))


def decode_blocks_triton(
    slots: torch.Tensor,
    escapes,
    base8: torch.Tensor,
    base16: torch.Tensor,
    geometry: BlockGeometry,
    *,
    out: torch.Tensor | None = None,
    fast: bool = False,
    launch: LaunchConfig | None = None,
) -> torch.Tensor:
    """Decode N slots to BF16 in one launch (bit-identical to ``codec.decode_blocks``).

    ``fast=True`` uses the fused attention's decoder (``_tile.decode_rows_pairs``, sub-tiles of
    ``launch.tile_tokens`` rows): identical bits for every slot the encoder wrote with fits == True, fewer
    ops; the default decoder also matches the reference on corrupt slots (validate=False semantics).

    Args:
        slots: uint8 ``[N, slot_bytes]`` (blocks whose encoding fit).
        escapes: uint8 rows ``[N, W]`` or ``(heap uint8 [M], esc_start int64 [N])``, as for
            ``codec.decode_blocks``.
        base8, base16: uint8 ``[D]`` or ``[N, D]``.
        out: optional preallocated bf16 ``[N, T, D]``.
        launch: ``tile_tokens`` and ``num_warps`` (:class:`~gaac_hf.kernels.paged.LaunchConfig`);
            any values give the same bits. Defaults: fast path 16-row sub-tiles at d=64, 8 rows
            above, and ``max(2, D / 64)`` warps (the H200 sweep in ``eval/results/codec_h200_rowscan.json``),
            reference path ``max(4, T * D / 1024)`` warps.
    Returns:
        bf16 ``[N, T, D]``.
    """
    _check_geometry(geometry)
    g = geometry
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.shape[1] != g.slot_bytes:
        raise ValueError(f"slots must be uint8 [N, {g.slot_bytes}], got {slots.dtype} {tuple(slots.shape)}")
    n, t, d = slots.shape[0], g.block_size, g.head_dim
    heap, esc_start = escape_source(escapes, n, slots.device)
    heap, esc_start = heap.contiguous(), esc_start.contiguous()
    if heap.numel() == 0:  # a valid pointer; every read is masked (outside the heap) anyway
        heap = torch.zeros(1, dtype=torch.uint8, device=slots.device)
        heap_len = 0
    else:
        heap_len = heap.numel()
    b8, s8 = _bases(base8, n, d, "base8")
    b16, s16 = _bases(base16, n, d, "base16")
    if s8 != s16:
        b8, b16 = b8.expand(n, d).contiguous(), b16.expand(n, d).contiguous()
        s8 = d
    if out is None:
        out = torch.empty(n, t, d, dtype=torch.bfloat16, device=slots.device)
    elif out.dtype != torch.bfloat16 or out.shape != (n, t, d) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [{n}, {t}, {d}]")
    launch = launch or DEFAULT_LAUNCH
    if fast:
        ts = min(launch.tile_tokens or (16 if d <= 64 else 8), t)
        warps = launch.num_warps or max(2, d // 64)
    else:
        ts, warps = t, launch.num_warps or max(4, t * d // 1024)
    if n:
        _decode_kernel[(n,)](
            slots.contiguous(), heap, esc_start, heap_len, b8, b16, out.view(torch.int16),
            _row_scratch((n if fast else 1) * t, slots.device), s8,
            SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset, T=t, D=d, FAST=fast, TS=ts,
            num_warps=warps,
        )
    return out


@triton.jit
def _table_decode_kernel(
    SLOTS0, HEAP0, ESC_START0, RAW0, TABLE0, B8_0, B16_0, TAIL0,  # kind 0 (K): as below
    SLOTS1, HEAP1, ESC_START1, RAW1, TABLE1, B8_1, B16_1, TAIL1,  # kind 1 (V)
    # SLOTS *uint8 [num_slots, SLOT_BYTES]; HEAP *uint8 [M]; ESC_START *int64 [num_slots];
    # RAW *int16 [num_raw, T, D]; TABLE *int32 [B, H, MAXB] (e >= 0 slot, e < 0 raw row -1-e);
    # B8/B16 *uint8 [H, D]; TAIL *int16 rows after the blocks (strides tail_sb, tail_sh, tail_st)
    OUT,  # *int16 [NKIND, B, H, S, D]
    ROWOFF,  # *int16 [NKIND, NB, B * H, T]: scratch (row offsets of each slot program)
    H, MAXB, S, NB, TAIL_LEN, tail_sb, tail_sh, tail_st, kind_stride,
    SLOT_BYTES: tl.constexpr,
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    TS: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    kind = tl.program_id(2)
    h = bh % H
    r = tl.arange(0, TS)[:, None]
    c = tl.arange(0, D)[None, :]
    row0 = OUT + kind * kind_stride + bh * S * D  # row 0 of this (kind, b, h)
    if j < NB:
        table = tl.where(kind == 0, TABLE0, TABLE1)
        e = tl.load(table + bh * MAXB + j).to(tl.int64)
        dst = row0 + j * (T * D)
        if e >= 0:  # a slot: every slot a table references was written with fits == True
            slots = tl.where(kind == 0, SLOTS0, SLOTS1)
            heap = tl.where(kind == 0, HEAP0, HEAP1)
            esc_start = tl.where(kind == 0, ESC_START0, ESC_START1)
            rowoff = ROWOFF + ((kind * NB + j) * tl.num_programs(0) + bh) * T
            _fast_block(dst, slots + e * SLOT_BYTES, heap + tl.load(esc_start + e), tl.where(kind == 0, B8_0, B8_1),
                        tl.where(kind == 0, B16_0, B16_1), h, rowoff, LO2_OFF, HI1_OFF, TAG_OFF, T, D, TS)
        else:  # a raw-fallback block: copied as it is
            src = tl.where(kind == 0, RAW0, RAW1) + (-1 - e) * (T * D)
            for sub in tl.static_range(T // TS):
                tl.store(dst + (sub * TS + r) * D + c, tl.load(src + (sub * TS + r) * D + c))
    else:  # programs past the blocks: T rows each of the tail (a prefill chunk's can be long)
        b = bh // H
        src = tl.where(kind == 0, TAIL0, TAIL1) + b * tail_sb + h * tail_sh
        dst = row0 + NB * (T * D)
        for sub in tl.static_range(T // TS):
            rows = (j - NB) * T + sub * TS + r
            m = rows < TAIL_LEN
            tl.store(dst + rows * D + c, tl.load(src + rows * tail_st + c, mask=m), mask=m)


def _check_pool(name, geometry: BlockGeometry, slots, heap, esc_start, raw, table, base8, base16):
    g = geometry
    t, d = g.block_size, g.head_dim
    if table.dtype != torch.int32 or table.dim() != 3 or not table.is_contiguous():
        raise ValueError(f"{name} table must be contiguous int32 [B, H, max_blocks], got {table.dtype} {tuple(table.shape)}")
    if slots.dtype != torch.uint8 or slots.shape[1:] != (g.slot_bytes,) or heap.dtype != torch.uint8 or heap.numel() == 0:
        raise ValueError(f"{name} slots must be uint8 [N, {g.slot_bytes}] and its heap a non-empty uint8 [M]")
    if esc_start.dtype != torch.int64 or esc_start.dim() != 1:
        raise ValueError(f"{name} esc_start must be int64 [num_slots]")
    if raw.dtype != torch.bfloat16 or raw.shape[1:] != (t, d) or raw.shape[0] == 0:
        raise ValueError(f"{name} raw must be bf16 [>= 1, {t}, {d}]")
    h = table.shape[1]
    for bn, bb in (("base8", base8), ("base16", base16)):
        if bb.dtype != torch.uint8 or bb.shape != (h, d):
            raise ValueError(f"{name} {bn} must be uint8 [{h}, {d}], got {bb.dtype} {tuple(bb.shape)}")


def decode_tables_triton(
    parts: list[PagedTensor],
    geometry: BlockGeometry,
    num_blocks: int,
    out: torch.Tensor,
    tails: list[torch.Tensor] | None = None,
    *,
    launch: LaunchConfig | None = None,
) -> torch.Tensor:
    """Decode the first ``num_blocks`` blocks of every (row, kv-head) of one or two paged caches (a
    layer's K and V) through their block tables into BF16, and append their tails: one launch.

    One program per (kind, row, head, block): a slot entry is decoded with the fast decoder (slots
    that a table references were all written with fits == True), a raw entry is copied; the tail
    rows are copied by one more program per T of them. Bit-identical to the reference ``GAACLayer``
    gather (``codec.decode_blocks`` + raw rows + the tail); no host sync.

    Args:
        parts: one or two :class:`~gaac_hf.kernels.paged.PagedTensor` (K, V; shapes in
            ``kernels/paged.py``, ``max_blocks >= num_blocks``); their ``tail`` is not read.
        num_blocks: blocks per (row, head).
        out: contiguous bf16 ``[len(pools), B, H, S, D]``, ``S = num_blocks * T + tail rows``.
        tails: None (then ``S`` must be ``num_blocks * T``) or one bf16 ``[B, H, S - num_blocks*T, D]``
            per pool (any strides with a unit last one), written after the blocks.
        launch: the fast decoder's ``tile_tokens`` / ``num_warps`` (see :func:`decode_blocks_triton`).
    Returns:
        ``out``.
    """
    _check_geometry(geometry)
    g = geometry
    t, d = g.block_size, g.head_dim
    if len(parts) not in (1, 2):
        raise ValueError(f"one or two paged tensors (K, V), got {len(parts)}")
    names = ("K", "V")
    for name, p in zip(names, parts):
        if not isinstance(p, PagedTensor):
            raise TypeError(f"{name}: expected a PagedTensor, got {type(p).__name__}")
        _check_pool(name, g, p.slots, p.heap, p.esc_start, p.raw, p.table, p.base8, p.base16)
    b, h, maxb = parts[0].table.shape
    if len(parts) == 2 and parts[1].table.shape != (b, h, maxb):
        raise ValueError("K and V tables differ in shape")
    if not 0 <= num_blocks <= maxb:
        raise ValueError(f"num_blocks {num_blocks} outside the table's [0, {maxb}]")
    n = len(parts)
    if out.dtype != torch.bfloat16 or out.dim() != 5 or tuple(out.shape[:3]) != (n, b, h) or out.shape[4] != d \
            or out.shape[3] < num_blocks * t or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [{n}, {b}, {h}, >= {num_blocks * t}, {d}], got {out.dtype} {tuple(out.shape)}")
    s = out.shape[3]
    tl_len = s - num_blocks * t
    if tails is None:
        if tl_len:
            raise ValueError(f"out has {tl_len} rows past the blocks but no tails were given")
        tails = [parts[0].raw] * n  # any valid pointer: no tail program runs
    else:
        if len(tails) != n:
            raise ValueError(f"{n} pools but {len(tails)} tails")
        for name, x in zip(names, tails):
            if x.dtype != torch.bfloat16 or tuple(x.shape) != (b, h, tl_len, d) or (tl_len and x.stride(3) != 1):
                raise ValueError(f"{name} tail must be bf16 [{b}, {h}, {tl_len}, {d}] with unit channel stride, "
                                 f"got {x.dtype} {tuple(x.shape)}")
        if n == 2 and tails[0].stride() != tails[1].stride():
            tails = [x.contiguous() for x in tails]
    strides = tails[0].stride()[:3] if tl_len else (0, 0, 0)
    grid = (b * h, num_blocks + triton.cdiv(tl_len, t), n)
    if grid[0] * grid[1]:
        k, v = parts[0], parts[-1]
        kt, vt = tails[0], tails[-1]
        i16 = torch.int16
        launch = launch or DEFAULT_LAUNCH
        _table_decode_kernel[grid](
            k.slots, k.heap, k.esc_start, k.raw.view(i16), k.table, k.base8.contiguous(), k.base16.contiguous(), kt.view(i16),
            v.slots, v.heap, v.esc_start, v.raw.view(i16), v.table, v.base8.contiguous(), v.base16.contiguous(), vt.view(i16),
            out.view(i16), _row_scratch(n * max(num_blocks, 1) * b * h * t, out.device),
            h, maxb, s, num_blocks, tl_len, *strides, b * h * s * d,
            SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset,
            T=t, D=d, TS=min(launch.tile_tokens or (16 if d <= 64 else 8), t), num_warps=launch.num_warps or max(2, d // 64),
        )
    return out
