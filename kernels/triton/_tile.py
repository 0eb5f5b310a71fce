"""Triton device helpers shared by the GAAC encoder, decoder and fused attention.

Every helper works on one block (T tokens x D channels, groups of 8 along channels) viewed as a 4-D
register tile ``[T, Q, 4, 8]`` with ``Q = D / 32``: axis 3 is the 8 values of a group, axis 2 the 4
groups that share one tag byte, axes 0/1 the tag byte's (row, column). In that view every plane of a
slot (``gaac_hf.format.BlockGeometry``) is a plain strided tensor:

    sm   byte  at  t*D + c                    (c = (q*4 + i)*8 + j)          -> [T, Q, 4, 8]
    lo2  u16   at  t*G + q*4 + i  (G = D/8)   2 bits of each of 8 values     -> [T, Q, 4, 1]
    hi1  byte  at  t*G + q*4 + i              1 bit  of each of 8 values     -> [T, Q, 4, 1]
    tag  byte  at  t*Q + q                    2 bits of each of 4 groups     -> [T, Q, 1, 1]

so plane words are loaded once per group (coalesced) and broadcast against a shift vector, never
gathered per element. The lo2 plane is read as little-endian uint16: bytes 2g and 2g+1 hold the 8
2-bit codes of group g, LSB first, which is exactly the u16 ``sum_j code_j << 2j``.

The one irregular piece is the escape stream, which lives outside the slot in the escape heap (the
caller passes a pointer to the block's stream): group g's escape bytes start at the exclusive prefix
sum of the escape counts of groups < g (row-major group order). The format stores no per-group
offsets, so the prefix sum is computed here per block: over T*D/8 counts in the reference-order
decoder (``tl.cumsum``: 1/8 of an op per value), and in the pair decoder as a scan of the T row totals
plus two popcounts of each row's tag word (:func:`row_offsets`).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

#: True when kernels run through Triton's CPU interpreter (tests). The interpreter does bf16 math and
#: bf16 tl.dot incorrectly (triton-lang/triton#11584), so kernels then build fp32 operands from the
#: same bits instead of bf16 ones; the bits entering the dot are unchanged.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_SWAR = tl.constexpr(INTERPRET)  # popcount without libdevice (the interpreter has no popc)


@triton.jit
def tile_index(T: tl.constexpr, D: tl.constexpr):
    """Index tensors of the ``[T, Q, 4, 8]`` block view: (grp [T,Q,4,1], elem [T,Q,4,8],
    chan [1,Q,4,8], t [T,1,1,1], q [1,Q,1,1], i [1,1,4,1], j [1,1,1,8])."""
    Q: tl.constexpr = D // 32
    G: tl.constexpr = D // 8
    t = tl.arange(0, T)[:, None, None, None]
    q = tl.arange(0, Q)[None, :, None, None]
    i = tl.arange(0, 4)[None, None, :, None]
    j = tl.arange(0, 8)[None, None, None, :]
    grp = t * G + q * 4 + i
    chan = (q * 4 + i) * 8 + j
    elem = t * D + chan
    return grp, elem, chan, t, q, i, j


@triton.jit
def escape_starts(cnt, T: tl.constexpr, D: tl.constexpr):
    """Exclusive prefix sum of per-group escape counts ``[T, Q, 4, 1]`` in row-major group order."""
    Q: tl.constexpr = D // 32
    flat = tl.reshape(cnt, [T * (D // 8)])
    start = tl.cumsum(flat, 0) - flat
    return tl.reshape(start, [T, Q, 4, 1])


@triton.jit
def decode_block_bits(
    slot,  # *uint8: first byte of the slot
    heap,  # *uint8: the escape heap
    esc0,  # int64: offset of this block's escape stream in the heap
    heap_len,  # int64: bytes in the heap
    b8,  # int32 [1, Q, 4, 8]: base8 per channel
    b16,  # int32 [1, Q, 4, 8]: base16 per channel
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
):
    """One slot + its escape stream -> int32 ``[T, Q, 4, 8]`` holding the BF16 bit pattern of every
    value (0..0xFFFF).

    Mirrors ``gaac_hf.codec.decode_blocks`` exactly, including its behaviour on input the reference
    would reject with validate=True: tag 3 reads no escape bytes and uses the raw code; escape reads
    outside the heap return 0 (the reference's zero sink).
    """
    Q: tl.constexpr = D // 32
    grp, elem, chan, t, q, i, j = tile_index(T, D)
    sm = tl.load(slot + elem).to(tl.int32)
    lo2 = tl.load((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + grp).to(tl.int32)
    hi1 = tl.load(slot + HI1_OFF + grp).to(tl.int32)
    tagb = tl.load(slot + TAG_OFF + t * Q + q).to(tl.int32)
    tag = (tagb >> (2 * i)) & 3  # [T, Q, 4, 1]
    code = ((lo2 >> (2 * j)) & 3) | (((hi1 >> j) & 1) << 2)  # [T, Q, 4, 8]

    # escape bytes: count 1 (4-bit) or 5 (raw) per group, at the group's prefix-sum start
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5, 0))
    pos = escape_starts(cnt, T, D).to(tl.int64) + esc0  # heap offset of each group's stream
    inside = (pos >= 0) & (pos < heap_len)
    e0 = tl.load(heap + pos, mask=(cnt > 0) & inside, other=0).to(tl.int32)
    high = (e0 >> j) & 1
    is_raw = cnt == 5
    for k in tl.static_range(1, 5):
        ek = tl.load(heap + pos + k, mask=is_raw & (pos + k >= 0) & (pos + k < heap_len), other=0).to(tl.int32)
        high = high | (((ek >> j) & 1) << k)
    coded = code | (high << 3)
    exp = tl.where(tag == 0, b8 + coded, tl.where(tag == 1, b16 + coded, coded))
    # same formula as codec.join_bf16; & 0xFFFF = its int32 -> int16 truncation
    return (((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)) & 0xFFFF


# ---------------------------------------------------------------------------------------------
# pair decoder: a thread owns whole groups ([TS, G] tensors) and builds two BF16 per 32-bit op
# ---------------------------------------------------------------------------------------------
@triton.jit
def base_pair_words(BASE, h, D: tl.constexpr):
    """Per-channel bases of kv-head h -> 4 uint32 ``[1, G]`` words: word m holds channel 8g+2m's
    base in bits 7..14 and channel 8g+2m+1's in bits 23..30 (the exponent fields of a BF16 pair)."""
    g = tl.arange(0, D // 8)[None, :]
    p = BASE + h * D + 8 * g
    w0 = (tl.load(p + 0).to(tl.uint32) << 7) | (tl.load(p + 1).to(tl.uint32) << 23)
    w1 = (tl.load(p + 2).to(tl.uint32) << 7) | (tl.load(p + 3).to(tl.uint32) << 23)
    w2 = (tl.load(p + 4).to(tl.uint32) << 7) | (tl.load(p + 5).to(tl.uint32) << 23)
    w3 = (tl.load(p + 6).to(tl.uint32) << 7) | (tl.load(p + 7).to(tl.uint32) << 23)
    return w0, w1, w2, w3


@triton.jit
def _code_bytes(L, H, X):
    """lo2 fields (L, 4 fields in bits 0-7), hi1 bits (H, bits 0-3), escape bits (X, bits 0-3) ->
    one uint32 with the 4 codes as bytes in order [v0, v2, v1, v3] (bits 0-1 lo2, bit 2 hi1, bit 3 escape)."""
    x = (L | (L << 14)) & 0x00330033
    x = (x | (x << 4)) & 0x03030303
    h = ((H & 0xF) * 0x00820104) & 0x04040404
    e = ((X & 0xF) * 0x01040208) & 0x08080808
    return x | h | e


@triton.jit
def _raw_high_bytes(X1, X2, X3, X4):
    """Escape bytes 1-4 of raw groups (bits 0-3 of each: values 0-3) -> coded-exponent bits 4-7 as bytes
    in order [v0, v2, v1, v3]."""
    r = ((X1 & 0xF) * 0x02080410) & 0x10101010
    r = r | (((X2 & 0xF) * 0x04100820) & 0x20202020)
    r = r | (((X3 & 0xF) * 0x08201040) & 0x40404040)
    return r | (((X4 & 0xF) * 0x10402080) & 0x80808080)


@triton.jit
def _bf16_pair(sm16, P, base):
    """sm16: the two sign|mantissa bytes of the pair in bits 0-15; P: the two coded exponents in bits
    0-7 / 16-23; base: the selected base pair word (bits 7-14 / 23-30) -> the BF16 pair."""
    y = sm16 + (sm16 & 0xFF00) * 255  # [b0, 0, b1, 0]
    return P * 128 + base + y + (y & 0x00800080) * 255


@triton.jit
def planes_to_pairs(smlo, smhi, lo2, hi1, tag, esc, e0, has_raw, b8w0, b8w1, b8w2, b8w3,
                    b16w0, b16w1, b16w2, b16w3):
    """A group's planes (sm words, lo2, hi1, tag, escape pointer and first escape
    byte, ``[TS, G]`` each) -> its 4 uint32 BF16 pair words. ``has_raw``: whether any group of these
    rows is raw (a uniform branch: only then are escape bytes 1-4 read)."""
    E = _code_bytes(lo2, hi1, e0)
    F = _code_bytes(lo2 >> 8, hi1 >> 4, e0 >> 4)
    if has_raw:  # coded-exponent bits 4..7 of raw groups from escape bytes 1..4
        is_raw = tag == 2
        x1 = tl.load(esc + 1, mask=is_raw, other=0).to(tl.uint32)
        x2 = tl.load(esc + 2, mask=is_raw, other=0).to(tl.uint32)
        x3 = tl.load(esc + 3, mask=is_raw, other=0).to(tl.uint32)
        x4 = tl.load(esc + 4, mask=is_raw, other=0).to(tl.uint32)
        E = E | _raw_high_bytes(x1, x2, x3, x4)
        F = F | _raw_high_bytes(x1 >> 4, x2 >> 4, x3 >> 4, x4 >> 4)
    keep = (tag != 2).to(tl.uint32)
    is4 = (tag == 1).to(tl.uint32)
    w0 = _bf16_pair(smlo & 0xFFFF, E & 0x00FF00FF, b8w0 * keep + (b16w0 - b8w0) * is4)
    w1 = _bf16_pair(smlo >> 16, (E >> 8) & 0x00FF00FF, b8w1 * keep + (b16w1 - b8w1) * is4)
    w2 = _bf16_pair(smhi & 0xFFFF, F & 0x00FF00FF, b8w2 * keep + (b16w2 - b8w2) * is4)
    w3 = _bf16_pair(smhi >> 16, (F >> 8) & 0x00FF00FF, b8w3 * keep + (b16w3 - b8w3) * is4)
    return w0, w1, w2, w3


@triton.jit
def _popc(x):
    """Set bits of each uint32 (``libdevice.popc``; a SWAR count under the CPU interpreter, which lacks it)."""
    if _SWAR:
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return (x * 0x01010101) >> 24
    else:
        return libdevice.popc(x.to(tl.int32, bitcast=True)).to(tl.uint32)


@triton.jit
def _tag_escape_bytes(tw, sel):
    """Escape bytes of the groups of a row's tag word ``tw`` (group g's 2-bit tag at bits 2g, 2g+1)
    that ``sel`` selects (its bit 2g set): 1 per 4-bit group (tag 1), 5 per raw group (tag 2)."""
    lo = tw & 0x55555555
    hi = (tw >> 1) & 0x55555555
    ones = lo & (hi ^ 0x55555555) & sel
    twos = hi & (lo ^ 0x55555555) & sel
    return _popc(ones) + 5 * _popc(twos)


@triton.jit
def _row_tag_words(slot, rows, TAG_OFF: tl.constexpr, D: tl.constexpr):
    """The tag words of ``rows`` of a slot as uint32: d=64 one 16-bit word (8 groups), d=128 one 32-bit
    word (16 groups), d=256 two (groups 0-15, 16-31; the second is 0 for smaller d)."""
    if D == 64:
        return tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint16)) + rows).to(tl.uint32), 0
    elif D == 128:
        return tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + rows), 0
    else:
        w = (slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + 2 * rows
        return tl.load(w), tl.load(w + 1)


@triton.jit
def row_offsets(slot, rowoff, TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr):
    """Start of each row's escape bytes in the block's stream -> ``rowoff`` (int16 ``[T]`` scratch of
    this program), and whether the block has a raw group (a scalar).

    The format stores no escape offsets: group g of row t starts at the exclusive prefix of the escape
    counts before it in row-major order. This splits it into a per-row part, one scan of the T row
    totals per block (stored here and read back by every sub-tile, hence the barrier), and an in-row
    part from the row's tag word (:func:`decode_rows_pairs`: two popcounts). It replaced a scan over
    every group of every sub-tile: sm_90, d=128, -12% instructions and 55 -> 20 barriers in the fast
    decoder (lab/experiments/decode_rowoff.py, "row scan"). Callers that reuse ``rowoff`` for the
    next block must not overwrite it before every thread has read it (double-buffer it)."""
    rows = tl.arange(0, T)
    tw0, tw1 = _row_tag_words(slot, rows, TAG_OFF, D)
    tot = _tag_escape_bytes(tw0, 0x55555555)
    raw = (tw0 >> 1) & (tw0 ^ 0xFFFFFFFF) & 0x55555555
    if D == 256:
        tot += _tag_escape_bytes(tw1, 0x55555555)
        raw = raw | ((tw1 >> 1) & (tw1 ^ 0xFFFFFFFF) & 0x55555555)
    tl.store(rowoff + rows, (tl.cumsum(tot, 0) - tot).to(tl.int16))
    tl.debug_barrier()  # the offsets are read back by other threads of the program
    return tl.max(raw, 0) != 0


@triton.jit
def group_plane_words(slot, r0, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TS: tl.constexpr, D: tl.constexpr):
    """The per-group plane words of rows [r0, r0+TS) of a slot, ``[TS, G]`` uint32 each: the 8
    sign|mantissa bytes as two words (values 0-3, 4-7), the lo2 u16 and the hi1 byte."""
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None]
    g = tl.arange(0, G)[None, :]
    gi = t * G + g
    sm = tl.load((slot + r0 * D).to(tl.pointer_type(tl.int64)) + gi)
    smlo = sm.to(tl.uint32)
    smhi = (sm >> 32).to(tl.uint32)
    lo2 = tl.load((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + r0 * G + gi).to(tl.uint32)
    hi1 = tl.load(slot + HI1_OFF + r0 * G + gi).to(tl.uint32)
    return smlo, smhi, lo2, hi1


@triton.jit
def decode_rows_pairs(
    slot, stream, rowoff, r0, has_raw, b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3,
    LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    TS: tl.constexpr, D: tl.constexpr,
):
    """Rows [r0, r0+TS) of a slot written by the encoder (fits == True), whose escape stream starts at
    ``stream`` (a pointer into the escape heap) and whose row offsets :func:`row_offsets` wrote to
    ``rowoff`` (``has_raw``: its return value), -> 4 uint32 ``[TS, G]`` words per group (word m =
    values 2m, 2m+1 as a BF16 pair, little-endian).

    Per group: one 8-byte sm load, the lo2/hi1 words, the row's tag word and its escape byte at
    rowoff[t] + the escape bytes of the row's earlier groups (two popcounts of the tag word). The 8
    coded exponents become bytes of two words (:func:`_code_bytes`, values 0-3 and 4-7) in an order
    where a pair's two codes are one mask away, and each pair is then a few multiply-adds
    (:func:`_bf16_pair`); the base is chosen by multiplies, not selects.
    """
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None]
    g = tl.arange(0, G)[None, :]
    smlo, smhi, lo2, hi1 = group_plane_words(slot, r0, LO2_OFF, HI1_OFF, TS, D)
    tw0, tw1 = _row_tag_words(slot, r0 + t, TAG_OFF, D)
    if D == 256:  # groups 16-31 live in the second word, after all of the first word's escapes
        upper = g >= 16
        gg = tl.where(upper, g - 16, g).to(tl.uint32)
        tw = tl.where(upper, tw1, tw0)
        pre = _tag_escape_bytes(tw, (tl.full([1, 1], 1, tl.uint32) << (2 * gg)) - 1)
        pre += tl.where(upper, _tag_escape_bytes(tw0, 0x55555555), 0)
    else:
        gg = g.to(tl.uint32)
        tw = tw0
        pre = _tag_escape_bytes(tw, (tl.full([1, 1], 1, tl.uint32) << (2 * gg)) - 1)
    tag = (tw >> (2 * gg)) & 3
    esc = stream + (tl.load(rowoff + r0 + t).to(tl.int32) + pre.to(tl.int32))
    e0 = tl.load(esc, mask=tag > 0, other=0).to(tl.uint32)
    return planes_to_pairs(smlo, smhi, lo2, hi1, tag, esc, e0, has_raw,
                           b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3)


@triton.jit
def raw_pair_words(ptr, r0, vlen, TS: tl.constexpr, D: tl.constexpr):
    """Rows [r0, r0+TS) of an uncompressed BF16 [*, D] block at ``ptr`` (int16 pointer) as the same 4
    uint32 ``[TS, G]`` pair words the decoder produces (one 16-byte load per group); rows >= vlen -> 0."""
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None, None]
    g = tl.arange(0, G)[None, :, None]
    m = tl.arange(0, 4)[None, None, :]
    w = tl.load(ptr.to(tl.pointer_type(tl.uint32)) + (r0 + t) * (D // 2) + g * 4 + m, mask=r0 + t < vlen, other=0)
    a, b = tl.split(tl.reshape(w, [TS, G, 2, 2]))  # a: m in {0, 2}, b: m in {1, 3}
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def pairs_to_tile(w0, w1, w2, w3, TS: tl.constexpr, D: tl.constexpr):
    """4 uint32 pair words ``[TS, G]`` -> int16 ``[TS, D]`` (value 2m+p of group g at column 8g+2m+p).
    Joins only append register-resident axes: no data moves between threads."""
    l0 = w0.to(tl.int16)  # low half (truncation)
    l1 = w1.to(tl.int16)
    l2 = w2.to(tl.int16)
    l3 = w3.to(tl.int16)
    h0 = (w0 >> 16).to(tl.int16)
    h1 = (w1 >> 16).to(tl.int16)
    h2 = (w2 >> 16).to(tl.int16)
    h3 = (w3 >> 16).to(tl.int16)
    # axes appended in order x (m >> 1), y (m & 1), z (p): column = 8g + 4x + 2y + z = 8g + 2m + p
    lo = tl.join(tl.join(l0, l2), tl.join(l1, l3))
    hi = tl.join(tl.join(h0, h2), tl.join(h1, h3))
    return tl.reshape(tl.join(lo, hi), [TS, D])
