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

The one irregular piece is the escape stream: group g's escape bytes start at the exclusive prefix sum
of the escape counts of groups < g (row-major group order). The format stores no offsets, so the
prefix sum is computed here per block (``tl.cumsum`` over T*D/8 counts: 1/8 of an op per value).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: True when kernels run through Triton's CPU interpreter (tests). The interpreter does bf16 math and
#: bf16 tl.dot incorrectly (triton-lang/triton#11584), so kernels then build fp32 operands from the
#: same bits instead of bf16 ones; the bits entering the dot are unchanged.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


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
    b8,  # int32 [1, Q, 4, 8]: base8 per channel
    b16,  # int32 [1, Q, 4, 8]: base16 per channel
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    ESC_OFF: tl.constexpr,
    CAP: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
):
    """One slot -> int32 ``[T, Q, 4, 8]`` holding the BF16 bit pattern of every value (0..0xFFFF).

    Mirrors ``gaac_hf.codec.decode_blocks`` exactly, including its behaviour on slots the reference
    would reject with validate=True: tag 3 reads no escape bytes and uses the raw code; escape reads
    past the capacity return 0 (the reference's zero scratch column).
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
    start = escape_starts(cnt, T, D)
    esc = slot + ESC_OFF + start
    e0 = tl.load(esc, mask=(cnt > 0) & (start < CAP), other=0).to(tl.int32)
    high = (e0 >> j) & 1
    is_raw = cnt == 5
    for k in tl.static_range(1, 5):
        ek = tl.load(esc + k, mask=is_raw & (start + k < CAP), other=0).to(tl.int32)
        high = high | (((ek >> j) & 1) << k)
    coded = code | (high << 3)
    exp = tl.where(tag == 0, b8 + coded, tl.where(tag == 1, b16 + coded, coded))
    # same formula as codec.join_bf16; & 0xFFFF = its int32 -> int16 truncation
    return (((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)) & 0xFFFF


@triton.jit
def decode_rows_fast(
    slot,  # *uint8: first byte of the slot
    r0,  # first row (token) of the sub-tile inside the block
    esc_base,  # escape bytes used by rows < r0 (running sum carried by the caller)
    b8s,  # int32 [1, Q, 4, 8]: base8 << 7 per channel
    b16s,  # int32 [1, Q, 4, 8]: base16 << 7 per channel
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    ESC_OFF: tl.constexpr,
    TS: tl.constexpr,
    D: tl.constexpr,
):
    """Rows ``[r0, r0 + TS)`` of a slot -> (int32 ``[TS, Q, 4, 8]`` BF16 bits, esc_base + escape bytes
    of these rows). Same bits as :func:`decode_block_bits` for every slot the encoder wrote
    (fits == True: no tag 3, no escape overrun), with fewer integer ops per value:

    * BF16 bits are a SUM of disjoint fields: ``sign|mant`` (sign-extended sm byte & 0x807F),
      ``base << 7`` (per channel, pre-shifted once per program) and ``coded << 7``: exp <= 255 for a
      valid slot, so adding never carries into the sign bit.
    * ``coded << 7`` is assembled from group words pre-shifted once per group (1/8 op per value),
      so each value costs one shift + one mask per source plane.
    * escape bytes 1-4 (raw groups: ~0.1-0.4% of groups) are only read in sub-tiles that hold a raw
      group (a uniform branch), not masked-loaded for every group.
    * sub-tiles of TS rows keep the register footprint small; the escape offset is carried across
      sub-tiles, so the prefix sum only spans TS*D/8 groups.
    """
    Q: tl.constexpr = D // 32
    G: tl.constexpr = D // 8
    grp, elem, chan, t, q, i, j = tile_index(TS, D)
    sm = tl.load(slot + r0 * D + elem).to(tl.int8, bitcast=True).to(tl.int32)  # sign-extended
    lo2 = tl.load((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + r0 * G + grp).to(tl.int32) << 7
    hi1 = tl.load(slot + HI1_OFF + r0 * G + grp).to(tl.int32) << 9
    tagb = tl.load(slot + TAG_OFF + r0 * Q + t * Q + q).to(tl.int32)
    tag = (tagb >> (2 * i)) & 3  # [TS, Q, 4, 1]
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5, 0))
    flat = tl.reshape(cnt, [TS * G])
    incl = tl.cumsum(flat, 0)
    start = tl.reshape(incl - flat, [TS, Q, 4, 1]) + esc_base
    esc = slot + ESC_OFF + start
    e0 = tl.load(esc, mask=cnt > 0, other=0).to(tl.int32) << 10
    c7 = ((lo2 >> (2 * j)) & 0x180) | ((hi1 >> j) & 0x200) | ((e0 >> j) & 0x400)
    base7 = tl.where(tag == 0, b8s, tl.where(tag == 1, b16s, 0))
    bits = (sm & 0x807F) + base7 + c7
    if tl.max(tl.reshape(tag, [TS * G]), 0) == 2:  # a raw group here: bits 4..7 of its exponents
        is_raw = cnt == 5
        extra = tl.zeros_like(bits)
        for k in tl.static_range(1, 5):
            ek = tl.load(esc + k, mask=is_raw, other=0).to(tl.int32)
            extra = extra | (((ek >> j) & 1) << (10 + k))
        bits = bits + extra
    return bits, esc_base + tl.sum(flat, 0)
