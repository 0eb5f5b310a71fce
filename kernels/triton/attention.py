"""Fused GAAC decode attention (q_len = 1 per sequence) over a paged, compressed KV cache.

Contract (what ``gaac_hf.cache`` calls; all tensors on one CUDA device, no host sync, CUDA-graph safe)
------------------------------------------------------------------------------------------------------
One layer's K and V arrive as a :class:`~gaac_hf.kernels.paged.PagedKV` (shapes and block-table
encoding in ``kernels/paged.py``); launch knobs as a :class:`~gaac_hf.kernels.paged.LaunchConfig`::

    out = gaac_decode_attention(q, kv, scale=None, out=None, launch=None)
    q: bf16 [B, Hq, D] (Hq % Hkv == 0, query head h uses kv head h // (Hq // Hkv))  -> out bf16 [B, Hq, D]

Slots must be ones the encoder wrote with fits == True and their streams in the heap (the attention
decoder assumes no reserved tags and reads no bounds). ``bf16_decode_attention(q, kv, ...)`` is the
same kernel compiled without the compressed path (every table entry must be negative): the BF16
baseline over an uncompressed paged cache. ``kernels/triton/pack.py`` builds a paged K or V from
dense ``[B, Hkv, S, D]`` tensors (tests, benchmarks); ``kernels/reference.py`` holds the fp64
attention this kernel is checked against.

Kernel structure (flash-decoding)
---------------------------------
Grid ``(B * Hkv, num_splits)``: program (b, h, s) walks blocks ``[s*bps, (s+1)*bps)`` of sequence b,
clipped on the device to ``num_blocks[b] + 1`` (the extra virtual block is the tail), so the launch
shape depends only on host ints (B, Hkv, max_blocks): no host sync, capturable in a CUDA graph.
Each K/V tile is decoded ONCE into registers and used by all ``Hq/Hkv`` query heads of the group,
padded to 16 rows for ``tl.dot``. Online softmax in base 2; each split writes (o, lse) and a second
small kernel merges the splits by LSE and rounds to BF16 (round-to-nearest-even done with integer ops,
so CPU interpreter and GPU agree).

Decoding (``_tile.decode_rows_pairs``): a thread owns whole groups of 8 values; per group it loads the
8 sign|mantissa bytes (one 8-byte load), the lo2/hi1/tag words and its escape byte (from the heap, at
``esc_start[e]`` plus the group's offset in the stream), turns the code planes into one byte per
coded exponent (two words per group, shifts and one multiply per plane), and then builds the values
two at a time in 32-bit words (a BF16 pair per multiply-add chain). Tiles are sub-blocks of
``tile_tokens`` rows; each group's escape offset comes from the block's row offsets
(``_tile.row_offsets``: one scan of the T row totals per block, then two popcounts per group).

Bit identity GAAC vs BF16: a raw block or the tail is loaded as the same four 32-bit pair words per
group that the decoder produces, and everything after (the join into the ``[TS, D]`` tile, the dot,
the softmax) is one code path. Since decoding is bit-exact, GAAC's output has the same bits as the same
kernel over the raw cache: ``bf16_decode_attention`` (compiled without the compressed branch, KV_MODE=1)
at the same ``num_warps``/``num_splits``/``tile_tokens`` -- checked on the H200 for 45 benchmark cases
and in ``tests/test_kernels_attention.py`` -- and ``bf16_decode_attention(..., same_path=True)``, the
mixed kernel itself on an all-raw table (identical by construction). Different tile sizes or split
counts change the accumulation order, so bit identity is a per-config statement.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from gaac_hf.format import BlockGeometry

from ..paged import DEFAULT_LAUNCH, LaunchConfig, PagedKV
from ._tile import INTERPRET, base_pair_words, decode_rows_pairs, pairs_to_tile, raw_pair_words, row_offsets
from .encode import _check_geometry

NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": fully masked rows stay NaN-free


@triton.jit
def _tile_bits(
    SLOTS, stream, RAW, TAIL, e, is_blk, vlen, tail_off, r0, rowoff, has_raw, a0, a1, a2, a3, c0, c1, c2, c3,
    SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    TS: tl.constexpr, T: tl.constexpr, D: tl.constexpr, KV_MODE: tl.constexpr,
):
    """Bits of rows [r0, r0+TS) of one K or V block as int16 ``[TS, D]`` -- decoded from a slot
    (e >= 0; its row offsets in ``rowoff``, see ``_tile.row_offsets``), or loaded from a raw block
    (e < 0) or the tail. Both sources produce the same 4 pair words per group, so everything after
    (the join into the tile, the dot) is one code path: the root of GAAC == BF16 bit identity."""
    if KV_MODE == 0:
        if e >= 0:
            w0, w1, w2, w3 = decode_rows_pairs(
                SLOTS + e.to(tl.int64) * SLOT_BYTES, stream, rowoff, r0, has_raw, a0, a1, a2, a3, c0, c1, c2, c3,
                LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
        else:
            w0, w1, w2, w3 = _raw_words(RAW, TAIL, e, is_blk, vlen, tail_off, r0, TS, T, D)
    else:
        w0, w1, w2, w3 = _raw_words(RAW, TAIL, e, is_blk, vlen, tail_off, r0, TS, T, D)
    return pairs_to_tile(w0, w1, w2, w3, TS, D)


@triton.jit
def _block_row_offsets(SLOTS, e, rowoff, SLOT_BYTES: tl.constexpr, TAG_OFF: tl.constexpr, T: tl.constexpr,
                       D: tl.constexpr, KV_MODE: tl.constexpr):
    """Row offsets of block entry ``e`` into ``rowoff`` when it is a slot; whether it has a raw group."""
    has_raw = False
    if KV_MODE == 0:
        if e >= 0:
            has_raw = row_offsets(SLOTS + e.to(tl.int64) * SLOT_BYTES, rowoff, TAG_OFF, T, D)
    return has_raw


@triton.jit
def _raw_words(RAW, TAIL, e, is_blk, vlen, tail_off, r0, TS: tl.constexpr, T: tl.constexpr, D: tl.constexpr):
    """Pair words of rows [r0, r0+TS) of a raw block (row ``-1-e`` of the raw pool) or of the tail;
    rows >= vlen read as 0 (they are masked out of the softmax)."""
    if is_blk:
        ptr = RAW + (-1 - e).to(tl.int64) * (T * D)
    else:
        ptr = TAIL + tail_off
    return raw_pair_words(ptr, r0, vlen, TS, D)


@triton.jit
def _as_dot_operand(bits, FP32_DOT: tl.constexpr):
    """int16 BF16 bit patterns -> dot operand. Under the CPU interpreter: the exact fp32 value."""
    if FP32_DOT:
        return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return bits.to(tl.bfloat16, bitcast=True)


@triton.jit
def _attn_split_kernel(
    Qb,  # *int16 [B, HQ, D]
    K_SLOTS, V_SLOTS,  # *uint8 [*, SLOT_BYTES]
    K_HEAP, V_HEAP,  # *uint8 [*]: escape heaps
    K_ESC_START, V_ESC_START,  # *int64 [*]: stream offset per slot
    K_RAW, V_RAW,  # *int16 [*, T, D]
    K_TABLE, V_TABLE,  # *int32 [B, HKV, MAXB]
    K_TAIL, V_TAIL,  # *int16 [B, HKV, T, D]
    KB8, KB16, VB8, VB16,  # *uint8 [HKV, D]
    NUM_BLOCKS, TAIL_LEN, KV_START,  # *int32 [B]
    PART_O,  # *fp32 [B, HQ, S, D]
    PART_L,  # *fp32 [B, HQ, S]
    ROWOFF,  # *int16 [B * HKV * S, 2 (K, V), 2 (buffers), T]: row-offset scratch of each program
    scale_log2,
    MAXB,
    BPS,  # blocks per split
    S,  # splits
    HKV: tl.constexpr,
    GQ: tl.constexpr,  # query heads per kv head
    QP: tl.constexpr,  # GQ padded to >= 16 (tl.dot minimum)
    SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    KV_MODE: tl.constexpr,  # 0: compressed + raw blocks; 1: raw only (BF16 baseline)
    HAS_START: tl.constexpr,
    FP32_DOT: tl.constexpr,
    TS: tl.constexpr,  # tokens per sub-tile (divides T)
):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    HQ: tl.constexpr = HKV * GQ

    r = tl.arange(0, QP)
    d = tl.arange(0, D)
    qrow = b * HQ + h * GQ + r  # [QP]
    qbits = tl.load(Qb + qrow[:, None] * D + d[None, :], mask=(r < GQ)[:, None], other=0)
    qm = _as_dot_operand(qbits, FP32_DOT)

    if KV_MODE == 0:  # per-channel bases as BF16-pair exponent words, once per program
        ka0, ka1, ka2, ka3 = base_pair_words(KB8, h, D)
        kc0, kc1, kc2, kc3 = base_pair_words(KB16, h, D)
        va0, va1, va2, va3 = base_pair_words(VB8, h, D)
        vc0, vc1, vc2, vc3 = base_pair_words(VB16, h, D)
    else:
        ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3 = 0, 0, 0, 0, 0, 0, 0, 0
        va0, va1, va2, va3, vc0, vc1, vc2, vc3 = 0, 0, 0, 0, 0, 0, 0, 0

    nb = tl.load(NUM_BLOCKS + b)
    tlen = tl.load(TAIL_LEN + b)
    if HAS_START:
        start = tl.load(KV_START + b)
    else:
        start = 0
    lo = split * BPS
    hi = tl.minimum(lo + BPS, nb + 1)  # block nb is the tail
    tab = bh.to(tl.int64) * MAXB
    tail_off = bh.to(tl.int64) * (T * D)
    tok = tl.arange(0, TS)

    m_i = tl.full([QP], NEG, tl.float32)
    l_i = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    for blk in range(lo, hi):
        is_blk = blk < nb
        ek = tl.load(K_TABLE + tab + blk, mask=is_blk, other=-1)
        ev = tl.load(V_TABLE + tab + blk, mask=is_blk, other=-1)
        vlen = tl.where(is_blk, T, tlen)
        if KV_MODE == 0:  # escape streams of the two blocks (unused for raw blocks and the tail)
            kstream = K_HEAP + tl.load(K_ESC_START + tl.maximum(ek, 0))
            vstream = V_HEAP + tl.load(V_ESC_START + tl.maximum(ev, 0))
        else:
            kstream = K_HEAP
            vstream = V_HEAP
        # two scratch buffers per kind, alternating by block: a thread can be writing block blk + 1's
        # offsets while another still reads block blk's (row_offsets' barrier orders the rest)
        krow = ROWOFF + ((bh.to(tl.int64) * S + split) * 4 + (blk % 2)) * T
        vrow = krow + 2 * T
        khas = _block_row_offsets(K_SLOTS, ek, krow, SLOT_BYTES, TAG_OFF, T, D, KV_MODE)
        vhas = _block_row_offsets(V_SLOTS, ev, vrow, SLOT_BYTES, TAG_OFF, T, D, KV_MODE)
        for sub in tl.static_range(T // TS):  # sub-tiles keep registers small
            r0 = sub * TS
            kt = _tile_bits(K_SLOTS, kstream, K_RAW, K_TAIL, ek, is_blk, vlen, tail_off, r0, krow, khas,
                            ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3,
                            SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE)
            s = tl.dot(qm, tl.trans(_as_dot_operand(kt, FP32_DOT))) * scale_log2  # [QP, TS]
            valid = tok + r0 < vlen
            if HAS_START:
                valid = valid & (blk * T + r0 + tok >= start)
            s = tl.where(valid[None, :], s, NEG)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.where(valid[None, :], tl.exp2(s - m_new[:, None]), 0.0)
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = _tile_bits(V_SLOTS, vstream, V_RAW, V_TAIL, ev, is_blk, vlen, tail_off, r0, vrow, vhas,
                            va0, va1, va2, va3, vc0, vc1, vc2, vc3,
                            SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE)
            if FP32_DOT:
                pv = tl.dot(p, _as_dot_operand(vt, FP32_DOT))
            else:
                pv = tl.dot(p.to(tl.bfloat16), _as_dot_operand(vt, FP32_DOT))
            acc = acc * alpha[:, None] + pv
            m_i = m_new

    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG)
    prow = qrow.to(tl.int64) * S + split
    tl.store(PART_O + prow[:, None] * D + d[None, :], o, mask=(r < GQ)[:, None])
    tl.store(PART_L + prow, lse, mask=r < GQ)


@triton.jit
def _merge_kernel(PART_O, PART_L, OUT, S, SP2: tl.constexpr, D: tl.constexpr):
    """LSE-merge the splits of one (b, q-head) row and round to BF16 (RNE, integer ops)."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, SP2)
    d = tl.arange(0, D)
    ms = sp < S
    lse = tl.load(PART_L + row * S + sp, mask=ms, other=NEG)
    mx = tl.max(lse, 0)
    w = tl.where(lse > 0.5 * NEG, tl.exp2(lse - mx), 0.0)
    o = tl.load(PART_O + (row * S + sp[:, None]) * D + d[None, :], mask=ms[:, None], other=0.0)
    den = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(den > 0, den, 1.0)
    u = res.to(tl.uint32, bitcast=True)
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits = tl.where(nan, 0x7FC0, rne)
    tl.store(OUT + row * D + d, bits.to(tl.uint16).to(tl.int16, bitcast=True))


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
_SM_COUNT: dict = {}


class _LastLaunch(Mapping):
    """``splits`` / ``blocks_per_split`` / ``n_regs`` / ``n_spills`` of the last split-kernel launch
    (benchmarks report them: ``dict(LAST_LAUNCH)``). A launch stores only the kernel object and two
    ints; the register counts are read from the kernel when asked for."""

    _KEYS = ("splits", "blocks_per_split", "n_regs", "n_spills")

    def __init__(self) -> None:
        self._last = None  # (kernel, splits, blocks_per_split)

    def __getitem__(self, key):
        if self._last is None or key not in self._KEYS:
            raise KeyError(key)
        kern, splits, bps = self._last
        if key == "splits":
            return splits
        if key == "blocks_per_split":
            return bps
        return getattr(kern, key, None)

    def __iter__(self):
        return iter(self._KEYS if self._last is not None else ())

    def __len__(self) -> int:
        return len(self._KEYS) if self._last is not None else 0

    def __repr__(self) -> str:
        return repr(dict(self))


#: splits / registers / spills of the last split-kernel launch (benchmarks report them)
LAST_LAUNCH = _LastLaunch()
LAST_KERNEL = None


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


#: programs per SM the default split count aims for (memory-bound: many loads in flight per SM)
PROGRAMS_PER_SM = 4


def default_num_splits(batch: int, kv_heads: int, max_blocks: int, device: torch.device) -> int:
    """About PROGRAMS_PER_SM programs per SM; each split walks >= 2 blocks."""
    target = PROGRAMS_PER_SM * _sm_count(device)
    want = max(1, (target + batch * kv_heads - 1) // (batch * kv_heads))
    return max(1, min(want, (max_blocks + 1 + 1) // 2))


def _as_i16(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16, got {t.dtype}")
    return t.view(torch.int16)


@functools.lru_cache(maxsize=64)
def _geometry_constants(geometry: BlockGeometry) -> tuple[int, int, int, int, int, int]:
    """(T, D, slot_bytes, lo2_offset, hi1_offset, tag_offset) as plain ints, computed once per geometry."""
    g = geometry
    return g.block_size, g.head_dim, g.slot_bytes, g.lo2_offset, g.hi1_offset, g.tag_offset


@functools.lru_cache(maxsize=64)
def _checked_geometry(geometry: BlockGeometry) -> BlockGeometry:
    """``_check_geometry`` once per geometry (a failing check raises every time: nothing is cached)."""
    _check_geometry(geometry)
    return geometry


@functools.lru_cache(maxsize=256)
def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


# Split-kernel scratch (part_o, part_l, rowoff), reused from call to call: key -> (splits, part_o,
# part_l, rowoff). Safe because the key holds the CUDA stream: on one stream the merge kernel of a
# call has read the partials before the next call's split kernel overwrites them (stream order), and
# rowoff is private to each program of one launch. CPU calls run synchronously. Calls made while a
# CUDA graph is being captured allocate their own.
_SCRATCH: dict = {}
_SCRATCH_KEYS_MAX = 32


def _partials(B: int, HQ: int, HKV: int, S: int, T: int, D: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def make():
        return (torch.empty(B, HQ, S, D, dtype=torch.float32, device=device),
                torch.empty(B, HQ, S, dtype=torch.float32, device=device),
                torch.empty(B * HKV * S, 4, T, dtype=torch.int16, device=device))

    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return make()
        idx = device.index if device.index is not None else torch.cuda.current_device()
        key = (device.type, idx, torch._C._cuda_getCurrentRawStream(idx), B, HQ, HKV, T, D)
    else:
        key = (device.type, device.index, 0, B, HQ, HKV, T, D)
    hit = _SCRATCH.get(key)
    if hit is None or hit[0] != S:
        if hit is None and len(_SCRATCH) >= _SCRATCH_KEYS_MAX:
            _SCRATCH.clear()
        hit = _SCRATCH[key] = (S, *make())
    return hit[1], hit[2], hit[3]


def _launch(q: torch.Tensor, kv: PagedKV, scale, out, kv_mode: int, launch: LaunchConfig | None) -> torch.Tensor:
    launch = launch or DEFAULT_LAUNCH
    geometry = _checked_geometry(kv.geometry)
    k, v = kv.k, kv.v
    B, HQ, D = q.shape
    _, HKV, MAXB = k.table.shape
    T, GD, SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF = _geometry_constants(geometry)
    if D != GD or HQ % HKV:
        raise ValueError(f"q [B, Hq, D] = {tuple(q.shape)} does not match head_dim {GD} / Hkv {HKV}")
    tail_shape = (B, HKV, T, D)
    if k.tail.shape != tail_shape or v.tail.shape != tail_shape:
        raise ValueError(f"tails must be bf16 [B, Hkv, T, D] = [{B}, {HKV}, {T}, {D}]")
    table_shape = (B, HKV, MAXB)
    for name, t in (("k.table", k.table), ("v.table", v.table)):
        if t.dtype != torch.int32 or t.shape != table_shape or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int32 [B, Hkv, max_blocks]")
    if not (q.is_contiguous() and all(t.is_contiguous() for p in (k, v) for t in (p.slots, p.heap, p.esc_start, p.raw, p.tail))):
        raise ValueError("q, pools, heaps and tails must be contiguous")
    for name, p in (("k", k), ("v", v)):
        if p.heap.dtype != torch.uint8 or p.heap.dim() != 1 or p.heap.numel() == 0:
            raise ValueError(f"{name}.heap must be a non-empty uint8 [M] escape heap")
        if p.esc_start.dtype != torch.int64 or p.esc_start.dim() != 1 or p.esc_start.shape[0] < p.slots.shape[0]:
            raise ValueError(f"{name}.esc_start must be int64 [num_slots >= {p.slots.shape[0]}]")
    bases = (k.base8, k.base16, v.base8, v.base16)
    for bb in bases:
        if bb.dtype != torch.uint8 or bb.shape != (HKV, D):
            raise ValueError(f"bases must be uint8 [Hkv, D], got {bb.dtype} {tuple(bb.shape)}")
    if not all(bb.is_contiguous() for bb in bases):
        bases = tuple(bb.contiguous() for bb in bases)
    GQ = HQ // HKV
    QP = max(16, _pow2(GQ))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    NB = MAXB if kv.active_blocks is None else min(MAXB, int(kv.active_blocks))  # must be >= max(num_blocks)
    dev = q.device
    S = launch.num_splits or default_num_splits(B, HKV, NB, dev)
    BPS = (NB + 1 + S - 1) // S  # splits cover blocks [0, NB] (block NB of a full sequence = its tail)
    part_o, part_l, rowoff = _partials(B, HQ, HKV, S, T, D, dev)
    if out is None:
        out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=dev)
    kv_start = kv.kv_start
    has_start = kv_start is not None
    kb8, kb16, vb8, vb16 = bases
    tile_tokens = launch.tile_tokens or 32
    maxnreg = launch.maxnreg
    kern = _attn_split_kernel[(B * HKV, S)](
        _as_i16(q), k.slots, v.slots, k.heap, v.heap, k.esc_start, v.esc_start, _as_i16(k.raw), _as_i16(v.raw), k.table, v.table,
        _as_i16(k.tail), _as_i16(v.tail), kb8, kb16, vb8, vb16,
        kv.num_blocks, kv.tail_len, kv_start if has_start else kv.num_blocks, part_o, part_l, rowoff,
        scale * 1.4426950408889634, MAXB, BPS, S,
        HKV=HKV, GQ=GQ, QP=QP, SLOT_BYTES=SLOT_BYTES, LO2_OFF=LO2_OFF, HI1_OFF=HI1_OFF,
        TAG_OFF=TAG_OFF, T=T, D=D, KV_MODE=kv_mode,
        HAS_START=has_start, FP32_DOT=INTERPRET, TS=min(tile_tokens, T),
        num_warps=launch.num_warps or 4, num_stages=launch.num_stages or 1,
        **({} if maxnreg is None or INTERPRET else {"maxnreg": maxnreg}),
    )
    global LAST_KERNEL
    LAST_KERNEL = kern
    LAST_LAUNCH._last = (kern, S, BPS)
    _merge_kernel[(B * HQ,)](part_o, part_l, out.view(torch.int16), S, SP2=max(2, _pow2(S)), D=D)
    return out


def gaac_decode_attention(q: torch.Tensor, kv: PagedKV, *, scale: float | None = None, out: torch.Tensor | None = None,
                          launch: LaunchConfig | None = None) -> torch.Tensor:
    """Decode attention of one new token per sequence over a GAAC paged cache (see module docstring).

    Args:
        q: bf16 ``[B, Hq, D]`` (Hq a multiple of Hkv; query head h reads kv-head ``h // (Hq // Hkv)``).
        kv: the layer's K and V (:class:`~gaac_hf.kernels.paged.PagedKV`, group_axis "channel");
            ``kv.kv_start`` masks left padding, ``kv.active_blocks`` sizes the default split count.
        scale: softmax scale (default 1/sqrt(D)).
        out: optional bf16 ``[B, Hq, D]``.
        launch: :class:`~gaac_hf.kernels.paged.LaunchConfig`; defaults: ~4 programs per SM worth of
            splits, 4 warps, 1 stage, 32-token sub-tiles (the best H200 configuration in
            ``eval/results/attention_h200.json``).
    Returns:
        bf16 ``[B, Hq, D]``.
    """
    return _launch(q, kv, scale, out, 0, launch)


def bf16_decode_attention(q: torch.Tensor, kv: PagedKV, *, scale: float | None = None, out: torch.Tensor | None = None,
                          launch: LaunchConfig | None = None, same_path: bool = False) -> torch.Tensor:
    """BF16 baseline: the same kernel over an uncompressed paged cache (every table entry < 0, e.g.
    from ``pack_paged_kv(..., compress=False)``; slots, heaps and bases are not read).

    ``same_path=False`` compiles the kernel without the compressed branch (KV_MODE=1: the fair speed
    baseline). ``same_path=True`` runs the GAAC kernel itself on the all-raw table (bit identity by
    construction). Arguments as in :func:`gaac_decode_attention`.
    """
    return _launch(q, kv, scale, out, 0 if same_path else 1, launch)
