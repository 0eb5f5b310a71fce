"""The pair decoder's rows function as the product had it until session 5: escape offsets from a scan
over every group of each sub-tile (``tl.cumsum`` over ``[TS * G]`` counts, the rows' total carried
from sub-tile to sub-tile). The product now computes them per row (``gaac_hf.kernels._tile.row_offsets``);
the experiment records that were measured against this version import it from here.
"""
import triton
import triton.language as tl

from gaac_hf.kernels.triton._tile import group_plane_words, planes_to_pairs


@triton.jit
def group_planes(slot, stream, r0, esc_base, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr,
                 TAG_OFF: tl.constexpr, TS: tl.constexpr, D: tl.constexpr):
    """The planes of rows [r0, r0+TS) of a slot, per group (``[TS, G]`` tensors): sign|mantissa bytes
    as two uint32 (values 0-3, 4-7), the lo2 u16 and hi1 byte, the tag, the pointer to the group's
    escape bytes, its first escape byte (0 for 3-bit groups) and ``tot``: the rows' escape bytes
    (bits 0-15) plus 65536 per raw group (one scan gives both the offsets and the raw flag)."""
    Q: tl.constexpr = D // 32
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None]
    g = tl.arange(0, G)[None, :]
    smlo, smhi, lo2, hi1 = group_plane_words(slot, r0, LO2_OFF, HI1_OFF, TS, D)
    tag = (tl.load(slot + TAG_OFF + r0 * Q + t * Q + g // 4).to(tl.int32) >> (2 * (g % 4))) & 3
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5 + 65536, 0))
    flat = tl.reshape(cnt, [TS * G])
    incl = tl.cumsum(flat, 0)
    tot = tl.max(incl, 0)
    start = (tl.reshape(incl - flat, [TS, G]) & 0xFFFF) + esc_base
    esc = stream + start
    e0 = tl.load(esc, mask=tag > 0, other=0).to(tl.uint32)
    return smlo, smhi, lo2, hi1, tag, esc, e0, tot


@triton.jit
def decode_rows_pairs(
    slot, stream, r0, esc_base, b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3,
    LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    TS: tl.constexpr, D: tl.constexpr,
):
    """Rows [r0, r0+TS) of a slot written by the encoder (fits == True), whose escape stream starts at
    ``stream`` (a pointer into the escape heap), -> 4 uint32 ``[TS, G]`` words per group (word m =
    values 2m, 2m+1 as a BF16 pair, little-endian) and the escape offset after these rows.

    Per group: one 8-byte sm load, the lo2/hi1/tag words and its escape byte at the group's
    prefix-sum offset. The 8 coded exponents become bytes of two words (:func:`_code_bytes`, values
    0-3 and 4-7) in an order where a pair's two codes are one mask away, and each pair is then a few
    multiply-adds (:func:`_bf16_pair`); the base is chosen by multiplies, not selects. Counted on
    sm_90 (``eval/sass_sm90.py``): 0.51 integer-pipe warp-instructions per value at d=128 in the
    standalone decoder, against 0.67 for the nibble-spreading version it replaced
    (``eval/experiments/decode_v2.py`` keeps that one and checks both bit for bit).
    """
    smlo, smhi, lo2, hi1, tag, esc, e0, tot = group_planes(slot, stream, r0, esc_base, LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
    w0, w1, w2, w3 = planes_to_pairs(smlo, smhi, lo2, hi1, tag, esc, e0, tot >= 65536,
                                     b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3)
    return w0, w1, w2, w3, esc_base + (tot & 0xFFFF)



