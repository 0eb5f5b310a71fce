"""The lossless contract of the reference codec, checked on bit patterns (int16 views).

Exhaustive over all 65,536 BF16 patterns in every channel position, property-based on random and
adversarial tensors, and on real K/V from SmolLM2-135M.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gaac_hf.codec import (
    decode_blocks,
    decode_tensor,
    encode_blocks,
    encode_tensor,
    group_modes,
    pack_escapes,
    split_bf16,
)
from gaac_hf.format import (
    ALIGN,
    ESCAPE_BYTES,
    FORMAT_VERSION,
    MODE_3BIT,
    MODE_4BIT,
    MODE_RAW,
    BlockGeometry,
)
from gaac_hf.models import cache_kwargs


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape
    diff = bits(a) != bits(b)
    assert not diff.any(), f"{int(diff.sum())} values changed bits, first at {diff.nonzero()[0].tolist()}"


def roundtrip(x, b8, b16, g):
    """Encode, then decode every block twice: from the escape rows and from a packed escape heap
    (the two forms must agree; blocks past the escape limit decode too, they are only stored raw)."""
    enc = encode_blocks(x, b8, b16, g)
    y = decode_blocks(enc.slots, enc.escapes, b8, b16, g)
    heap, start = pack_escapes(enc.escapes, enc.escape_len)
    assert heap.numel() == int(enc.escape_len.sum())
    assert_same_bits(decode_blocks(enc.slots, (heap, start), b8, b16, g), y)
    return enc, y


# ------------------------------------------------------------------------------------------------
# exhaustive
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["near", "scattered"])
@pytest.mark.parametrize("axis", ["channel", "token"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_bf16_pattern_in_every_channel(head_dim, axis, layout):
    """Column c holds all 65,536 patterns in a rotated order, so each pattern meets every channel.

    near: x[r, c] = pattern r + c, so a group's values share an exponent, and each block gets bases
        placed at a different offset below its exponents: all three modes occur for every pattern range.
    scattered: x[r, c] = pattern r + 257c with random per-channel bases: nearly every group is raw.
    """
    g = BlockGeometry(64, head_dim, axis)
    r = torch.arange(65536).unsqueeze(1)
    c = torch.arange(head_dim).unsqueeze(0)
    step = 1 if layout == "near" else 257
    x = ((r + c * step) % 65536).to(torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, 64, head_dim)
    n = x.shape[0]
    gen = torch.Generator().manual_seed(head_dim)
    if layout == "near":
        e_min = split_bf16(x)[0].reshape(n, -1).min(-1).values  # [N]
        blk = torch.arange(n)
        b8 = (e_min - blk % 9).clamp(0, 248).to(torch.uint8)[:, None].expand(n, head_dim).contiguous()
        b16 = (e_min - blk % 17 + 20 * (blk % 5 == 0)).clamp(0, 240).to(torch.uint8)[:, None].expand(n, head_dim).contiguous()
    else:
        b8 = torch.randint(0, 249, (head_dim,), generator=gen, dtype=torch.uint8)
        b16 = torch.randint(0, 241, (head_dim,), generator=gen, dtype=torch.uint8)
        b8[:2], b16[:2] = torch.tensor([0, 248], dtype=torch.uint8), torch.tensor([0, 240], dtype=torch.uint8)
    enc, y = roundtrip(x, b8, b16, g)
    assert_same_bits(y, x)
    # every pattern really occurred in every channel
    assert all(torch.unique(bits(x)[..., ch]).numel() == 65536 for ch in (0, head_dim - 1))
    modes = set(torch.unique(enc.tags).tolist())
    assert modes == ({MODE_3BIT, MODE_4BIT, MODE_RAW} if layout == "near" else modes | {MODE_RAW})
    if layout == "near":  # each mode covers many different exponents, not a corner
        e = split_bf16(x)[0].reshape(n, -1).min(-1).values
        for m in (MODE_3BIT, MODE_4BIT, MODE_RAW):
            assert torch.unique(e[(enc.tags == m).flatten(1).any(-1)]).numel() > (60 if m != MODE_RAW else 20)


# ------------------------------------------------------------------------------------------------
# modes, escapes, slot layout
# ------------------------------------------------------------------------------------------------
def _block_with_exponents(exps: torch.Tensor) -> torch.Tensor:
    """BF16 with the given exponent fields, alternating signs and varied mantissas."""
    mant = torch.arange(exps.numel()).reshape(exps.shape) % 128
    sign = (torch.arange(exps.numel()).reshape(exps.shape) % 2) << 15
    return (sign | (exps.to(torch.int32) << 7) | mant).to(torch.int16).view(torch.bfloat16)


def test_modes_and_escape_lengths():
    g = BlockGeometry(16, 64)
    b8 = torch.full((64,), 120, dtype=torch.uint8)
    b16 = torch.full((64,), 116, dtype=torch.uint8)
    e = torch.full((1, 16, 64), 123)  # inside both windows -> 3-bit everywhere
    e[0, 0, 3] = 130  # in the 16-window [116, 132) only -> group 0 of row 0 becomes 4-bit
    e[0, 5, 17] = 200  # in no window -> group 2 of row 5 becomes raw
    e[0, 9, 63] = 255  # NaN/Inf exponent -> raw
    x = _block_with_exponents(e)
    enc, y = roundtrip(x, b8, b16, g)
    assert_same_bits(y, x)
    tags = enc.tags[0]
    assert tags[0, 0] == MODE_4BIT and tags[5, 2] == MODE_RAW and tags[9, 7] == MODE_RAW
    assert int((tags != MODE_3BIT).sum()) == 3
    want = ESCAPE_BYTES[MODE_4BIT] + 2 * ESCAPE_BYTES[MODE_RAW]
    assert int(enc.escape_len[0]) == want
    # bytes past the escape stream are zero: the rows are a deterministic function of the block
    assert enc.escapes[0, :want].any() and not enc.escapes[0, want:].any()
    # the stream in group order: 4-bit group (row 0, group 0) first: its escape byte is bit 3 of the
    # 8 coded values (130 - 116 = 14 -> bit 3 set for value 3 only); then the two raw groups
    assert int(enc.escapes[0, 0]) == 1 << 3


def test_group_modes_pick_narrowest():
    exp = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17], [10, 11, 12, 13, 14, 15, 16, 18], [0, 1, 2, 3, 4, 5, 6, 40]])
    b8 = torch.full_like(exp, 10)
    b16 = torch.full_like(exp, 5)
    assert group_modes(exp, b8, b16).flatten().tolist() == [MODE_3BIT, MODE_4BIT, MODE_RAW]


def test_block_past_the_escape_limit_is_flagged_not_truncated():
    g = BlockGeometry(16, 64)
    b8 = torch.full((64,), 120, dtype=torch.uint8)
    b16 = torch.full((64,), 116, dtype=torch.uint8)
    e = torch.full((3, 16, 64), 121)
    e[1, :, ::8] = 250  # every group raw: 16*8*5 = 640 escape bytes > the limit (2048 - 1440 = 608)
    e[2, :, ::8] = 250
    e[2, :2, ::8] = 121  # 14 rows of raw groups: 560 bytes, just inside the limit
    x = _block_with_exponents(e)
    enc, y = roundtrip(x, b8, b16, g)
    assert g.escape_limit == 608
    assert enc.fits.tolist() == [True, False, True]
    assert enc.escape_len.tolist() == [0, 640, 560]
    assert_same_bits(y, x)  # the stream is complete in the rows even when the block does not fit
    heap, start = pack_escapes(enc.escapes, enc.escape_len)
    with pytest.raises(ValueError, match="past the escape heap"):
        decode_blocks(enc.slots, (heap[:-1], start), b8, b16, g)


def test_geometry_layout_and_version():
    for d in (64, 128, 256):
        for t in (16, 64, 256):
            g = BlockGeometry(t, d)
            offs = [g.sm_offset, g.lo2_offset, g.hi1_offset, g.tag_offset, g.slot_bytes]
            assert all(o % ALIGN == 0 for o in offs) and offs == sorted(offs)
            assert g.slot_bytes == t * d * (1 + 1 / 4 + 1 / 8 + 1 / 32)
            assert g.escape_limit == 2 * t * d - g.slot_bytes < g.max_escape_bytes
    g = BlockGeometry(64, 128, "token")
    assert BlockGeometry.from_dict(g.to_dict()) == g
    assert g.to_dict()["format_version"] == FORMAT_VERSION == 2
    with pytest.raises(ValueError, match="version"):
        BlockGeometry.from_dict(g.to_dict() | {"format_version": FORMAT_VERSION + 1})
    with pytest.raises(ValueError, match="upgrade_table_file"):  # a v1 table is refused with the way out
        BlockGeometry.from_dict(g.to_dict() | {"format_version": 1, "escape_capacity": 112})
    for bad in (dict(block_size=48), dict(head_dim=96), dict(group_axis="diag")):
        with pytest.raises(ValueError):
            BlockGeometry(**(dict(block_size=64, head_dim=64) | bad))


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
def test_bad_input_errors():
    g = BlockGeometry(16, 64)
    b = torch.zeros(64, dtype=torch.uint8)
    for dt in (torch.float16, torch.float32):
        with pytest.raises(TypeError, match="bfloat16"):
            encode_blocks(torch.zeros(1, 16, 64, dtype=dt), b, b, g)
    with pytest.raises(TypeError, match="bfloat16"):
        encode_tensor(torch.zeros(1, 16, 64), b[None], b[None], g)
    with pytest.raises(ValueError, match="shape"):
        encode_blocks(torch.zeros(1, 15, 64, dtype=torch.bfloat16), b, b, g)
    with pytest.raises(ValueError, match="shape"):
        encode_blocks(torch.zeros(16, 64, dtype=torch.bfloat16), b, b, g)
    with pytest.raises(TypeError, match="uint8"):
        encode_blocks(torch.zeros(1, 16, 64, dtype=torch.bfloat16), b.int(), b, g)
    with pytest.raises(ValueError, match="base16"):
        encode_blocks(torch.zeros(1, 16, 64, dtype=torch.bfloat16), b, torch.zeros(32, dtype=torch.uint8), g)
    with pytest.raises(ValueError, match="slots"):
        decode_blocks(torch.zeros(1, g.slot_bytes - 1, dtype=torch.uint8), torch.zeros(1, 8, dtype=torch.uint8), b, b, g)
    with pytest.raises(ValueError, match="escapes"):
        decode_blocks(torch.zeros(1, g.slot_bytes, dtype=torch.uint8), torch.zeros(2, 8, dtype=torch.uint8), b, b, g)
    with pytest.raises(ValueError, match="esc_start"):
        decode_blocks(torch.zeros(1, g.slot_bytes, dtype=torch.uint8), (torch.zeros(8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)), b, b, g)
    with pytest.raises(ValueError, match="base8"):
        encode_tensor(torch.zeros(2, 40, 64, dtype=torch.bfloat16), b[None], b[None].expand(2, 64), g)
    enc = encode_blocks(torch.ones(1, 16, 64, dtype=torch.bfloat16), b + 120, b + 120, g)
    enc.slots[0, g.tag_offset] = 0xFF  # reserved tag 3
    with pytest.raises(ValueError, match="reserved"):
        decode_blocks(enc.slots, enc.escapes, b + 120, b + 120, g)


# ------------------------------------------------------------------------------------------------
# property tests
# ------------------------------------------------------------------------------------------------
SPECIALS = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F]


@st.composite
def blocks(draw):
    d = draw(st.sampled_from([64, 128, 256]))
    t = draw(st.sampled_from([16, 32]))
    n = draw(st.integers(1, 3))
    axis = draw(st.sampled_from(["channel", "token"]))
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["normal", "bits", "nan_channel", "specials", "far", "subnormal"]))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([1e-3, 0.05, 1.0, 30.0]))
    x = (torch.randn(n, t, d, generator=gen) * scale).to(torch.bfloat16)
    xb = bits(x).clone()
    if kind == "bits":
        xb = torch.randint(-32768, 32768, (n, t, d), generator=gen, dtype=torch.int32).to(torch.int16)
    elif kind == "nan_channel":
        ch = torch.randint(0, d, (3,), generator=gen)
        xb[..., ch] = torch.tensor(0x7FC0 | 0x25, dtype=torch.int32).to(torch.int16)  # NaN with payload
    elif kind == "specials":
        idx = torch.randint(0, xb.numel(), (max(1, xb.numel() // 20),), generator=gen)
        vals = torch.tensor(SPECIALS, dtype=torch.int32).to(torch.int16)
        xb.view(-1)[idx] = vals[torch.randint(0, len(SPECIALS), idx.shape, generator=gen)]
    elif kind == "far":
        idx = torch.randint(0, xb.numel(), (max(1, xb.numel() // 50),), generator=gen)
        xb.view(-1)[idx] = bits(torch.tensor([1e30, -1e-30], dtype=torch.bfloat16))[idx % 2]
    elif kind == "subnormal":
        xb = (xb & ~0x7F80) if draw(st.booleans()) else (xb & 0x807F)  # exponent field 0
    e, _ = split_bf16(xb.view(torch.bfloat16))
    hist_based = draw(st.booleans())
    if hist_based:  # windows near the data, as calibration would pick
        med = e.reshape(-1, d).median(0).values.clamp(4, 240)
        b8 = (med - 3).clamp(0, 248).to(torch.uint8)
        b16 = (med - 7).clamp(0, 240).to(torch.uint8)
    else:
        b8 = torch.randint(0, 249, (n, d), generator=gen, dtype=torch.uint8)
        b16 = torch.randint(0, 241, (n, d), generator=gen, dtype=torch.uint8)
    g = BlockGeometry(t, d, axis)
    return xb.view(torch.bfloat16), b8, b16, g


@settings(max_examples=120, deadline=None)
@given(blocks())
def test_property_roundtrip_bits(case):
    x, b8, b16, g = case
    enc, y = roundtrip(x, b8, b16, g)
    assert_same_bits(y, x)  # every block, fitting or not
    assert (enc.fits == (enc.escape_len <= g.escape_limit)).all()
    assert (enc.escapes[torch.arange(enc.escapes.shape[1]) >= enc.escape_len[:, None]] == 0).all()
    # tags are the narrowest fitting mode
    e, _ = split_bf16(x)
    bb8 = (b8 if b8.dim() == 2 else b8[None]).to(torch.int32)[:, None, :].expand_as(e)
    bb16 = (b16 if b16.dim() == 2 else b16[None]).to(torch.int32)[:, None, :].expand_as(e)
    rows = (lambda t: t) if g.group_axis == "channel" else (lambda t: t.transpose(-1, -2))
    assert torch.equal(enc.tags, group_modes(rows(e), rows(bb8), rows(bb16)))
    fit = enc.fits
    if fit.any():  # what a cache stores: the fitting blocks' streams packed into a heap
        b8f = b8[fit] if b8.dim() == 2 else b8
        b16f = b16[fit] if b16.dim() == 2 else b16
        heap, start = pack_escapes(enc.escapes[fit], enc.escape_len[fit], start=3)
        heap = torch.cat([torch.full((3,), 0xEE, dtype=torch.uint8), heap])
        assert_same_bits(decode_blocks(enc.slots[fit], (heap, start), b8f, b16f, g), x[fit])


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(0, 300), st.sampled_from([64, 128]), st.integers(0, 2**31 - 1))
def test_property_tensor_api(heads, seq, d, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(heads, seq, d, generator=gen) * 0.3).to(torch.bfloat16)
    g = BlockGeometry(32, d)
    b8 = torch.full((heads, d), 120, dtype=torch.uint8)
    b16 = torch.full((heads, d), 114, dtype=torch.uint8)
    enc = encode_tensor(x, b8, b16, g)
    assert enc.tail.shape == (heads, seq % 32, d)
    assert enc.raw.shape[0] == int((~enc.blocks.fits).sum())
    assert_same_bits(decode_tensor(enc, b8, b16), x)
    assert enc.nbytes(with_overhead=False) <= enc.nbytes(with_overhead=True)


# ------------------------------------------------------------------------------------------------
# real K/V
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_kv(smollm2, wikitext_test):
    """Post-RoPE K and V of every layer of SmolLM2-135M on 768 held-out WikiText tokens: [L, 2, Hkv, S, D]."""
    from transformers import DynamicCache

    model, tok = smollm2
    ids = tok(wikitext_test[:20000], return_tensors="pt").input_ids[:, :768]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), use_cache=True)
    return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_real_smollm2_kv_bit_exact(real_kv, axis):
    from gaac_hf.calibration import choose_windows, exponent_histogram

    L, _, H, S, D = real_kv.shape
    # windows from the first 256 tokens, evaluated on all 768 (K drifts with position)
    b8, b16 = choose_windows(exponent_histogram(real_kv[..., :256, :]))  # [L, 2, H, D]
    g = BlockGeometry(64, D, axis)
    stored = plain = 0
    for layer in range(L):
        for kind in range(2):
            x = real_kv[layer, kind]
            enc = encode_tensor(x, b8[layer, kind], b16[layer, kind], g)
            assert_same_bits(decode_tensor(enc, b8[layer, kind], b16[layer, kind]), x)
            stored += enc.nbytes(with_overhead=False)
            plain += x.numel() * 2
    assert plain / stored > 1.35  # real KV compresses (paper: ~1.405 with calibrated windows)


def test_decoder_detects_any_single_plane_corruption():
    """Flipping one bit in any plane of a slot changes the decoded bits (nothing is redundant)."""
    g = BlockGeometry(16, 64)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(1, 16, 64, generator=gen) * 0.1).to(torch.bfloat16)
    b8 = torch.full((64,), 119, dtype=torch.uint8)
    b16 = torch.full((64,), 115, dtype=torch.uint8)
    enc = encode_blocks(x, b8, b16, g)
    assert enc.fits.all() and int(enc.escape_len[0]) > 0
    for off in (g.sm_offset, g.lo2_offset + 3, g.hi1_offset + 5):
        s = enc.slots.clone()
        s[0, off] ^= 1
        assert not torch.equal(bits(decode_blocks(s, enc.escapes, b8, b16, g)), bits(x))
    esc = enc.escapes.clone()
    esc[0, 0] ^= 1  # the escape stream too
    assert not torch.equal(bits(decode_blocks(enc.slots, esc, b8, b16, g)), bits(x))
