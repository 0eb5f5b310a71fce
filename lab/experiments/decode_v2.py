"""Experiment record: the pair decoder before and after the byte-code rewrite (format v2, same bits).

    python eval/experiments/decode_v2.py            # CPU interpreter: both bit-exact vs the reference codec
    python eval/experiments/decode_v2.py --sass     # sm_90 SASS counts, v1 vs the product (no GPU)

``decode_rows_pairs_v1`` below is the pair decoder the product used until this change (a nibble word
per group from three bit-spreads, ~10 integer ops per BF16 pair, selects for the base);
``gaac_hf.kernels._tile.decode_rows_pairs`` now builds the codes as bytes in the order
[v0, v2, v1, v3] (two shift-or-mask steps for lo2, one multiply each for the hi1 and escape bits),
so that a pair's two codes are one mask away, and makes each pair with multiply-adds
(``P * 128 + base``, ``y + (y & 0x00800080) * 255`` for the sign, ``b8 * keep + (b16 - b8) * is4``
for the base). Pure Triton, so the interpreter runs the code the GPU compiles. Counted on sm_90 in
the standalone decoder at d=128: 1.203 -> 0.953 warp-instructions per value (integer pipe 0.672 ->
0.514); eval/NOTES.md has the table and what was not measured.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--sass" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is defined

import triton
import triton.language as tl

from gaac_hf.kernels.triton._tile import base_pair_words, pairs_to_tile
from _scan_decoder import decode_rows_pairs, group_planes  # the version measured here


# ---- the v1 pair decoder (product until this change) ----
@triton.jit
def _spread2_v1(x):
    """uint32 with 8 2-bit fields in bits 0..15 -> field j in bits 4j..4j+1."""
    x = (x | (x << 8)) & 0x00FF00FF
    x = (x | (x << 4)) & 0x0F0F0F0F
    return (x | (x << 2)) & 0x33333333


@triton.jit
def _spread1_v1(x):
    """uint32 with 8 bits in bits 0..7 -> bit j at bit 4j."""
    x = (x | (x << 12)) & 0x000F000F
    x = (x | (x << 6)) & 0x03030303
    return (x | (x << 3)) & 0x11111111


@triton.jit
def _pair_v1(smh, n, hn, bw, HAS_RAW: tl.constexpr):
    """One BF16 pair: smh = the 2 sm bytes in bits 0..15, n/hn = coded-exponent nibbles (low / high
    4 bits) of the pair in bits 0..7, bw = selected base pair word."""
    y = (smh | (smh << 8)) & 0x00FF00FF  # byte per 16-bit lane
    e = bw + (((n & 0xF) << 7) | ((n & 0xF0) << 19))
    if HAS_RAW:
        e = e + (((hn & 0xF) << 11) | ((hn & 0xF0) << 23))
    return ((y & 0x00800080) << 8) | (y & 0x007F007F) | e


@triton.jit
def decode_rows_pairs_v1(
    slot, stream, r0, esc_base, b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3,
    LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    TS: tl.constexpr, D: tl.constexpr,
):
    """Rows [r0, r0+TS) of a slot written by the encoder (fits == True), whose escape stream starts at
    ``stream`` (a pointer into the escape heap), -> 4 uint32 ``[TS, G]`` words per group (word m =
    values 2m, 2m+1 as a BF16 pair, little-endian) and the escape offset after these rows.

    Per group (1/8 of the ops per value): one 8-byte sm load, the lo2/hi1/tag words, the escape byte
    at the group's prefix-sum offset, and three spread steps that turn the code planes into one
    nibble per value (``N``). Per pair of values: ~10 32-bit ops (byte spread, sign/mantissa masks,
    nibble -> exponent field, + base), i.e. ~5 per value, with no cross-lane data movement.
    """
    smlo, smhi, lo2, hi1, tag, esc, e0, tot = group_planes(slot, stream, r0, esc_base, LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
    n = _spread2_v1(lo2) | (_spread1_v1(hi1) << 2) | (_spread1_v1(e0) << 3)
    z = tl.zeros_like(b8w0)
    bw0 = tl.where(tag == 0, b8w0, tl.where(tag == 1, b16w0, z))
    bw1 = tl.where(tag == 0, b8w1, tl.where(tag == 1, b16w1, z))
    bw2 = tl.where(tag == 0, b8w2, tl.where(tag == 1, b16w2, z))
    bw3 = tl.where(tag == 0, b8w3, tl.where(tag == 1, b16w3, z))
    if tot >= 65536:  # a raw group in these rows: exponent bits 4..7 from escape bytes 1..4
        is_raw = tag == 2
        hn = _spread1_v1(tl.load(esc + 1, mask=is_raw, other=0).to(tl.uint32))
        hn = hn | (_spread1_v1(tl.load(esc + 2, mask=is_raw, other=0).to(tl.uint32)) << 1)
        hn = hn | (_spread1_v1(tl.load(esc + 3, mask=is_raw, other=0).to(tl.uint32)) << 2)
        hn = hn | (_spread1_v1(tl.load(esc + 4, mask=is_raw, other=0).to(tl.uint32)) << 3)
        w0 = _pair_v1(smlo & 0xFFFF, n, hn, bw0, True)
        w1 = _pair_v1(smlo >> 16, n >> 8, hn >> 8, bw1, True)
        w2 = _pair_v1(smhi & 0xFFFF, n >> 16, hn >> 16, bw2, True)
        w3 = _pair_v1(smhi >> 16, n >> 24, hn >> 24, bw3, True)
    else:
        w0 = _pair_v1(smlo & 0xFFFF, n, n, bw0, False)
        w1 = _pair_v1(smlo >> 16, n >> 8, n, bw1, False)
        w2 = _pair_v1(smhi & 0xFFFF, n >> 16, n, bw2, False)
        w3 = _pair_v1(smhi >> 16, n >> 24, n, bw3, False)
    return w0, w1, w2, w3, esc_base + (tot & 0xFFFF)



@triton.jit
def _decode_v2_kernel(SLOTS, HEAP, ESC_START, B8, B16, OUT, base_stride,
                      SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr,
                      TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr, TS: tl.constexpr, V2: tl.constexpr):
    """The standalone fast decoder (``gaac_hf.kernels.decode``, FAST=True) with the product pair
    decoder (V2=True) or the v1 one kept here (V2=False)."""
    n = tl.program_id(0).to(tl.int64)
    esc0 = tl.load(ESC_START + n)
    a0, a1, a2, a3 = base_pair_words(B8 + n * base_stride, 0, D)
    c0, c1, c2, c3 = base_pair_words(B16 + n * base_stride, 0, D)
    esc = tl.full([], 0, tl.int32)
    r = tl.arange(0, TS)[:, None]
    c = tl.arange(0, D)[None, :]
    for sub in tl.static_range(T // TS):
        if V2:
            w0, w1, w2, w3, esc = decode_rows_pairs(SLOTS + n * SLOT_BYTES, HEAP + esc0, sub * TS, esc,
                                                       a0, a1, a2, a3, c0, c1, c2, c3, LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
        else:
            w0, w1, w2, w3, esc = decode_rows_pairs_v1(SLOTS + n * SLOT_BYTES, HEAP + esc0, sub * TS, esc,
                                                       a0, a1, a2, a3, c0, c1, c2, c3, LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
        tl.store(OUT + n * (T * D) + (sub * TS + r) * D + c, pairs_to_tile(w0, w1, w2, w3, TS, D))


def decode_v2(slots, heap, esc_start, base8, base16, geometry, v2=True, tile_tokens=32):
    import torch
    g = geometry
    n = slots.shape[0]
    out = torch.full((n, g.block_size, g.head_dim), float("nan"), dtype=torch.bfloat16, device=slots.device)
    _decode_v2_kernel[(n,)](slots, heap, esc_start, base8, base16, out.view(torch.int16), base8.shape[-1] if base8.dim() > 1 else 0,
                            SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset,
                            T=g.block_size, D=g.head_dim, TS=min(tile_tokens, g.block_size), V2=v2,
                            num_warps=max(4, g.block_size * g.head_dim // 1024))
    return out


def _check_cpu():
    import torch
    from gaac_hf.codec import decode_blocks, encode_blocks, pack_escapes
    from gaac_hf.format import BlockGeometry
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    ok = True
    for d in (64, 128, 256):
        g = BlockGeometry(64, d, "channel")
        x = synthetic_kv((1, 2, 64 * 6, d), "k", seed=d, device="cpu")
        b8, b16 = calibrate(x)
        x = x.clone()
        # force 4-bit and raw groups: scale some rows, put arbitrary bit patterns in a few values
        xi = x.view(torch.int16)
        gen = torch.Generator().manual_seed(d)
        idx = torch.randint(0, xi.numel(), (xi.numel() // 200,), generator=gen)
        xi.view(-1)[idx] = torch.randint(-32768, 32767, (idx.numel(),), generator=gen, dtype=torch.int16)
        x[0, 1, 64:128] *= 300.0
        blocks = x[0].reshape(-1, 64, d)
        heads = torch.arange(2).repeat_interleave(6)
        enc = encode_blocks(blocks, b8[heads], b16[heads], g)
        fit = enc.fits
        heap, start = pack_escapes(enc.escapes[fit], enc.escape_len[fit])
        modes = [float((enc.tags[fit] == m).float().mean()) for m in range(3)]
        slots = enc.slots[fit].contiguous()
        want = decode_blocks(slots, (heap, start), b8[heads][fit], b16[heads][fit], g)
        for v2 in (False, True):
            got = decode_v2(slots, heap, start, b8[heads][fit].contiguous(), b16[heads][fit].contiguous(), g, v2=v2)
            same = torch.equal(got.view(torch.int16), want.view(torch.int16))
            ok &= same
            print(f"d={d} blocks={int(fit.sum())}/{fit.numel()} modes 3/4/raw={[round(m, 3) for m in modes]} "
                  f"{'product' if v2 else 'v1'} decoder bit-exact vs reference: {same}")
    return ok


def _sass():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sass_sm90 as S
    from gaac_hf.format import BlockGeometry
    sig = dict(SLOTS="*u8", HEAP="*u8", ESC_START="*i64", B8="*u8", B16="*u8", OUT="*i16", base_stride="i32")
    for d in (64, 128, 256):
        g = BlockGeometry(64, d, "channel")
        w = max(4, 64 * d // 1024)
        for v2 in (False, True):
            cons = dict(SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset,
                        T=64, D=d, TS=32, V2=v2)
            info = S.inspect(S.compile90(_decode_v2_kernel, sig, cons, w))
            pv = S.per_value(info, w, 64 * d)
            print(f"d={d:3d} {'product' if v2 else 'v1     '} regs {info['regs']:3d} sass {info['sass_total']:5d} "
                  f"warp-instr/value {pv['warp_instr_per_value']:.3f} INT {pv['int_warp_instr_per_value']:.3f} "
                  f"IMAD/value {info['imad'] * w / (64 * d):.3f} issue bound {pv['bound_gbps_bf16']:.0f} GB/s")


if __name__ == "__main__":
    if "--sass" in sys.argv:
        _sass()
    else:
        sys.exit(0 if _check_cpu() else 1)
