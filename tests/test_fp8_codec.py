"""FP8 tiles of format v3 (E4M3, E5M2): the reference codec (gaac_hf/codec/fp8.py) against the bytes it
was given, and its block bytes against an independent per-value reading of docs/FORMAT_V3.md.

Every comparison is of uint8 code patterns: all 256 codes in every channel position at d = 16/64/80/128/256,
NaN / Inf encodings of each format, adversarial blocks (random bytes that do not fit, extreme windows,
every mode mix), real SmolLM2 K/V converted as an FP8 cache converts it. A mutated layout constant must
make the independent reading fail.
"""
import pytest
import torch

import gaac_hf.codec.fp8 as F
from gaac_hf.codec.fp8 import (
    decode_blocks_fp8, decode_pool_fp8, encode_blocks_fp8, fp8_scale, quantize_fp8,
)
from gaac_hf.codec.v3 import FIELDS, pack_blocks
from gaac_hf.format.fp8 import GeometryFP8
from gaac_hf.format.v3 import GeometryV3, SEGMENT_CHUNKS
from tests.fp8_cases import DTYPES, adversarial_blocks, every_code_blocks, same_codes, special_blocks


def roundtrip(x, bn, bw, g):
    """Encode; decode the fitting rows directly and every block through a pool (raw fallbacks too)."""
    enc = encode_blocks_fp8(x, bn, bw, g)
    f = enc.fits
    expand = lambda b: b.expand(x.shape[0], g.head_dim) if b.dim() == 1 else b  # noqa: E731
    if bool(f.any()):
        same_codes(decode_blocks_fp8(enc.data[f], expand(bn)[f], expand(bw)[f], g), x[f])
    pool, entries = pack_blocks(enc, x)
    same_codes(decode_pool_fp8(pool, entries, bn, bw, g), x)
    return enc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
def test_every_code_in_every_channel(dtype, head_dim):
    g = GeometryFP8(64, head_dim, dtype)
    for i, (x, bn, bw) in enumerate(every_code_blocks(g)):
        for c in range(head_dim):  # every code really occurs in every channel
            assert torch.unique(x[..., c]).numel() == 256
        enc = roundtrip(x, bn, bw, g)
        shares = torch.bincount(enc.modes.reshape(-1), minlength=3)
        if i == 0:
            assert int(shares[0]) > 0 and int(shares[1]) > 0 and (int(shares[2]) > 0) == g.has_raw, shares


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_codes_and_float8_views(dtype):
    """NaN / Inf encodings of each format (dense and sparse) decode to their own bytes; the float8 view
    of the decoded block has NaNs and Infs exactly where the input had them."""
    g = GeometryFP8(64, 64, dtype)
    x, bn, bw = special_blocks(g)
    enc = roundtrip(x, bn, bw, g)
    assert bool(enc.fits[1]) and int((enc.modes[1] > 0).sum()) > 0  # the sparse block stays compressed
    pool, entries = pack_blocks(enc, x)
    y = decode_pool_fp8(pool, entries, bn, bw, g).view(F.torch_dtype(g)).float()
    xf = x.view(F.torch_dtype(g)).float()
    assert torch.equal(torch.isnan(y), torch.isnan(xf)) and torch.equal(torch.isinf(y), torch.isinf(xf))
    assert bool(torch.isnan(xf).any()) and (bool(torch.isinf(xf).any()) or dtype == "fp8_e4m3")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 96, 256])
def test_adversarial_blocks(dtype, head_dim):
    """Random bytes (too many wide groups: stored raw), KV-like codes at extreme windows, every
    (row, channel-group) mode mix, one wide group at the last chunk of each segment."""
    g = GeometryFP8(64, head_dim, dtype)
    x, bn, bw = adversarial_blocks(g, seed=head_dim)
    enc = roundtrip(x, bn, bw, g)
    assert not bool(enc.fits[0]) and bool(enc.fits[-1])
    assert (int((enc.modes == 2).sum()) > 0) == g.has_raw


# ---------------------------------------------------------------------------------------------
# the bytes against the document, read value by value (an independent decoder of the layout)
# ---------------------------------------------------------------------------------------------
def doc_decode(block: bytes, bn: list[int], bw: list[int], g: GeometryFP8) -> list[int]:
    """docs/FORMAT_V3.md "FP8 tiles", read literally, one value at a time (no code shared with the codec)."""
    u32 = lambda o: int.from_bytes(block[o:o + 4], "little")  # noqa: E731
    t, d, m, E = g.block_size, g.head_dim, g.man_bits, g.exp_bits
    cols, chunks = d // 8, (t // 4) * (d // 8)
    smb, code_off = 1 + m, chunks * 4 * (1 + m)
    segs = -(-chunks // SEGMENT_CHUNKS)
    segtab = code_off + 12 * chunks
    ent_off = segtab + 4 * (segs + 1)
    n_ent = u32(segtab + 4 * segs) & 0xFFFF
    entries = [int.from_bytes(block[ent_off + 2 * i:ent_off + 2 * i + 2], "little") for i in range(n_ent)]
    raw_off = ent_off + 2 * n_ent
    out = [0] * (t * d)
    listed = {}
    raw_i = 0
    for s in range(segs):
        lo, hi = u32(segtab + 4 * s) & 0xFFFF, u32(segtab + 4 * (s + 1)) & 0xFFFF
        for k in range(lo, hi):
            v = entries[k]
            raw = (v >> 7) & 1
            listed[(SEGMENT_CHUNKS * s + (v & 0x7F) // 4, (v & 0x7F) % 4)] = (v >> 8, block[raw_off + raw_i] if raw else 0)
            raw_i += raw
    for c in range(chunks):
        s, lane = divmod(c, SEGMENT_CHUNKS)
        ms = min(SEGMENT_CHUNKS, chunks - SEGMENT_CHUNKS * s)
        words = [u32(code_off + 4 * (3 * SEGMENT_CHUNKS * s + k * ms + lane)) for k in range(3)]
        rec = int.from_bytes(block[4 * smb * c: 4 * smb * (c + 1)], "little")
        for r in range(4):
            h, rawbyte = listed.get((c, r), (None, 0))
            for j in range(8):
                q, p = 4 * r + j // 2, j // 2
                if q < 15:
                    w, sh = FIELDS[q]
                    code = (words[w] >> (sh + 16 * (j % 2))) & 7
                else:
                    code = sum(((words[b] >> (15 + 16 * (j % 2))) & 1) << b for b in range(3))
                sm = (rec >> (smb * (8 * r + j))) & ((1 << smb) - 1)
                ch = 8 * (c % cols) + j
                if h is None:
                    e = bn[ch] + code
                else:
                    bit = p + 4 * (j % 2)
                    e = (bw[ch] + code + 8 * ((h >> bit) & 1) + 16 * ((rawbyte >> bit) & 1)) % (1 << E)
                row = 4 * (c // cols) + r
                out[row * d + ch] = ((sm >> m) << 7) | (e << m) | (sm & ((1 << m) - 1))
    return out


def _doc_case(dtype):
    """T = 16, D = 256 blocks of the every-code layout (the first 16 rows of each 64-row block, their bases)."""
    g = GeometryFP8(16, 256, dtype)  # 128 chunks: 4 segments, so the segment table and word-major codes matter
    x, bn, bw = next(iter(every_code_blocks(GeometryFP8(64, 256, dtype))))
    x = x[:, :16].contiguous()  # 16 rows: narrow, wide and (E5M2) raw groups in every segment
    return g, x, bn, bw


def check_against_document(g, x, bn, bw) -> None:
    """Round trip through the codec, then the first fitting blocks with wide (and raw) groups read by
    :func:`doc_decode` from the encoder's bytes."""
    enc = roundtrip(x, bn, bw, g)
    pick = enc.fits & (enc.modes == (2 if g.has_raw else 1)).flatten(1).any(1)
    assert bool(pick.any())
    for i in torch.nonzero(pick).flatten().tolist()[:3]:
        got = doc_decode(bytes(enc.data[i].tolist()), bn[i].tolist(), bw[i].tolist(), g)
        assert got == x[i].reshape(-1).tolist(), (g.dtype, i)


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_bytes_follow_the_document(dtype):
    check_against_document(*_doc_case(dtype))


@pytest.mark.parametrize("mutation", ["raw_bit", "sm_order", "entry_high_bit"])
def test_mutated_layout_is_caught(monkeypatch, mutation):
    """One layout detail of the codec changed (encoder and decoder alike): the round trip or the
    document's reading of the bytes must fail."""
    g, x, bn, bw = _doc_case("fp8_e5m2")
    if mutation == "raw_bit":  # raw-byte bits at other positions
        monkeypatch.setattr(F, "RAW_BYTE_BITS", 2)
    elif mutation == "sm_order":  # the sign/mantissa record in the reverse value order
        pack, unpack = F.pack_sm, F.unpack_sm
        monkeypatch.setattr(F, "pack_sm", lambda sm, g: pack(sm.flip(-1).flip(-2), g))
        monkeypatch.setattr(F, "unpack_sm", lambda data, g: unpack(data, g).flip(-1).flip(-2))
    else:  # exponent width of the fix-up one bit short (mod 16 instead of mod 32)
        apply = F._apply_entries
        monkeypatch.setattr(F, "_apply_entries", lambda *a, **k: apply(*a, **(k | {"exp_mask": 15})))
    with pytest.raises(AssertionError):
        check_against_document(g, x, bn, bw)


# ---------------------------------------------------------------------------------------------
# conversion, scales, header fields
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_is_torchs_conversion_after_the_scale(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 3, 40, 64, generator=gen) * 4).to(torch.bfloat16)
    tdt = torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e5m2
    s = fp8_scale(x, dtype)
    assert s.dtype == torch.float32 and s.dim() == 0
    same_codes(quantize_fp8(x, s, dtype), (x.float() / s).to(tdt).view(torch.uint8))
    sh = fp8_scale(x[0], dtype, per_head=True)
    assert sh.shape == (3,)
    same_codes(quantize_fp8(x[0], sh, dtype), (x[0].float() / sh[:, None, None]).to(tdt).view(torch.uint8))
    big = x * 8  # past a frozen scale (later tokens): whatever torch does there (E5M2: Inf), the same codes
    same_codes(quantize_fp8(big, s, dtype), (big.float() / s).to(tdt).view(torch.uint8))
    assert bool((quantize_fp8(big, s, dtype) & 0x7F == (0x7E if dtype == "fp8_e4m3" else 0x7C)).any())
    with pytest.raises(ValueError, match="per-head scale"):
        quantize_fp8(x[0], torch.ones(2), dtype)


def test_header_fields_are_checked_on_load():
    g = GeometryFP8(64, 128, "fp8_e5m2")
    d = g.to_dict()
    assert d == {"block_size": 64, "head_dim": 128, "dtype": "fp8_e5m2", "format_version": 3, "group_axis": "channel"}
    assert GeometryFP8.from_dict(d) == g
    with pytest.raises(ValueError, match="version 2"):
        GeometryFP8.from_dict(d | {"format_version": 2})
    with pytest.raises(ValueError, match="not an FP8 tile"):
        GeometryFP8.from_dict(d | {"dtype": "bf16"})
    with pytest.raises(ValueError, match="FP8 tiles are"):
        GeometryFP8(64, 128, "fp8_e3m4")
    with pytest.raises(ValueError, match="GeometryFP8"):
        GeometryV3.from_dict(d)  # a BF16 reader refuses FP8 tiles and names the reader that takes them
    x = torch.zeros(1, 64, 128, dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8 codes"):
        encode_blocks_fp8(x.to(torch.bfloat16), torch.zeros(128, dtype=torch.uint8), torch.zeros(128, dtype=torch.uint8), g)
    with pytest.raises(ValueError, match="base_w <= 16"):
        encode_blocks_fp8(x, torch.zeros(128, dtype=torch.uint8), torch.full((128,), 17, dtype=torch.uint8), g)
    with pytest.raises(ValueError, match="base_w <= 0"):
        encode_blocks_fp8(x, torch.zeros(128, dtype=torch.uint8), torch.ones(128, dtype=torch.uint8), GeometryFP8(64, 128))
    enc = encode_blocks_fp8(x.view(torch.float8_e5m2), torch.zeros(128, dtype=torch.uint8), torch.zeros(128, dtype=torch.uint8), g)
    assert bool(enc.fits.all())
    with pytest.raises(TypeError, match="FP8 tiles"):
        decode_pool_fp8(enc.data.reshape(-1), torch.zeros(1, dtype=torch.int64), torch.zeros(128, dtype=torch.uint8),
                        torch.zeros(128, dtype=torch.uint8), GeometryV3(64, 128))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_real_smollm2_kv_in_fp8(smollm2, wikitext_test, dtype):
    """Real post-RoPE K/V of SmolLM2-135M converted as an FP8 cache converts it (amax scale per tensor),
    windows from the first half: every block round-trips, and most groups are narrow."""
    from gaac_hf.calibration.collect import run_chunks, tokenize

    model, tok = smollm2
    ids = tokenize(tok, wikitext_test, 512)[None, :512]
    g = GeometryFP8(64, 64, dtype)
    for _, keys, values in run_chunks(model, ids, progress=False):
        for li in (0, 14, 29):
            for x in (keys[li], values[li]):
                codes = quantize_fp8(x, fp8_scale(x[:, :256], dtype), dtype)  # [H, S, D]
                bn, bw = F.choose_windows_fp8(F.exponent_histogram_fp8(codes[:, :256], g), g)
                blocks = codes.reshape(-1, 64, 64)
                bn, bw = bn.repeat_interleave(8, 0), bw.repeat_interleave(8, 0)
                enc = roundtrip(blocks, bn, bw, g)
                assert bool(enc.fits.all()) and float((enc.modes == 0).float().mean()) > 0.5
