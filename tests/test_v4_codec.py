"""The v4 reference codec (gaac_hf/codec/v4.py) and geometry: bit-exact round trips (int16 views) of every
BF16 pattern, adversarial and real K/V blocks; the byte layout pinned from the spec; no host sync in the
encoder and the packer; geometry validation; a mutation check (flipped bits must change the decode)."""
import contextlib

import pytest
import torch

from gaac_hf.codec.v4 import (
    decode_blocks_v4, decode_pool_v4, encode_blocks_v4, lane_coords, pack_blocks_v4, pool_offsets, stored_lengths,
)
from gaac_hf.format.v3 import GeometryV3
from gaac_hf.format.v4 import ENTRY_RAW, FORMAT_VERSION, GUARD, RAW_AT, GeometryV4
from tests.v3_cases import adversarial_blocks, every_pattern_blocks, same_bits

SHIPPED = "calibration_data/smollm2-135m.safetensors"


def bits_of(e: torch.Tensor, sm: torch.Tensor) -> torch.Tensor:
    """BF16 from int exponents and sign<<7|mantissa bytes."""
    b = ((sm & 0x80) << 8) | ((e & 0xFF) << 7) | (sm & 0x7F)
    return b.to(torch.int32).to(torch.int16).view(torch.bfloat16)


def round_trip(x: torch.Tensor, b16: torch.Tensor, g: GeometryV4, kind: str, gap: int = 0):
    """Encode, pack into a pool (blocks ``gap`` bytes apart, a sentinel elsewhere), read back: every block
    exact; BF16 blocks are x's bytes in the pool; the gaps keep the sentinel. Returns the encoding."""
    enc = encode_blocks_v4(x, b16, g, kind)
    n = x.shape[0]
    lens = stored_lengths(enc.fits, g)
    offs = torch.cumsum(lens + gap, 0) - lens - gap + 16
    pool = torch.full((int(offs[-1] + lens[-1]) + gap + GUARD,), 0xA5, dtype=torch.uint8)
    entries = pack_blocks_v4(enc, x, pool, offs)
    assert torch.equal(entries, offs | (~enc.fits).long())
    assert torch.equal(stored_lengths((entries & ENTRY_RAW) == 0, g), lens)
    same_bits(decode_pool_v4(pool, entries, b16, g, kind), x)
    xb = x.contiguous().view(torch.uint8).reshape(n, -1)
    written = torch.zeros(pool.numel(), dtype=torch.bool)
    for i in range(n):
        o, ln = int(offs[i]), int(lens[i])
        want = enc.data[i] if bool(enc.fits[i]) else xb[i]
        assert torch.equal(pool[o : o + ln], want)
        written[o : o + ln] = True
    written[-GUARD:] = True  # the guard area: unspecified
    assert bool((pool[~written] == 0xA5).all())
    f = enc.fits
    if bool(f.any()):
        same_bits(decode_blocks_v4(enc.data[f], b16 if b16.dim() == 1 else b16[f], g, kind), x[f])
    return enc


# ---------------------------------------------------------------------------------------------
# (a) every BF16 pattern in every channel position
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["k", "v"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_pattern_every_channel(head_dim, kind):
    """Column c holds all 65,536 patterns rotated by c, bases near each block's exponents (tests/v3_cases)."""
    g = GeometryV4(64, head_dim)
    x, _, b16 = next(iter(every_pattern_blocks(GeometryV3(64, head_dim))))
    enc = round_trip(x, b16, g, kind)
    assert 0 < int(enc.fits.sum()) < x.shape[0]  # both paths: tiles and BF16 blocks


def raw_pattern_blocks(g: GeometryV4, kind: str, seed: int = 0):
    """Every pattern through the raw records: each 16-token tile has 3 groups of 8 pattern values in 3
    lanes (rotating over lanes and k-steps), the rest 4-bit values of its window; random bases 0..255."""
    d, ks = g.head_dim, g.ksteps
    gen = torch.Generator().manual_seed(seed)
    n_tiles = -(-65536 // 24)
    n_tiles += -n_tiles % g.tiles
    nb = n_tiles // g.tiles
    b16 = torch.randint(0, 256, (nb, d), generator=gen)
    b16[0], b16[1] = 0, 255
    row, col = lane_coords(d, kind)
    tb = b16.repeat_interleave(g.tiles, 0)  # [tiles, D]
    room = (256 - tb).clamp(max=16)
    e = tb[:, None, :] + torch.randint(0, 1 << 20, (n_tiles, 16, d), generator=gen) % room[:, None, :]
    sm = torch.randint(0, 256, (n_tiles, 16, d), generator=gen)
    bits = bits_of(e, sm).view(torch.int16).to(torch.int32)
    pat = torch.arange(n_tiles * 24) % 65536
    i = torch.arange(n_tiles)
    for r in range(3):
        lane, s = (i + 11 * r) % 32, (7 * i + 3 * r) % ks
        q = 4 * s[:, None] + torch.arange(4)  # [tiles, 4] pairs of the group
        rr, cc = row[lane[:, None], q].reshape(n_tiles, 8), col[lane[:, None], q].reshape(n_tiles, 8)
        bits[i[:, None], rr, cc] = pat.reshape(n_tiles, 3, 8)[:, r].to(torch.int16).to(torch.int32)
    x = bits.to(torch.int16).view(torch.bfloat16).reshape(nb, g.block_size, d)
    return x, b16.to(torch.uint8)


@pytest.mark.parametrize("kind", ["k", "v"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_pattern_through_raw_records(head_dim, kind):
    g = GeometryV4(64, head_dim)
    x, b16 = raw_pattern_blocks(g, kind, seed=head_dim)
    enc = round_trip(x, b16, g, kind)
    assert bool(enc.fits.all())
    assert int(enc.raw_groups.sum()) > 0.95 * 3 * g.tiles * x.shape[0]


# ---------------------------------------------------------------------------------------------
# (b) adversarial blocks
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["k", "v"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_adversarial_v3_cases(head_dim, kind):
    """tests/v3_cases: NaN payloads, +-Inf, +-0, subnormals, random bits, extreme bases, mode mixes."""
    g = GeometryV4(64, head_dim)
    x, _, b16 = adversarial_blocks(GeometryV3(64, head_dim), seed=head_dim)
    enc = round_trip(x, b16, g, kind, gap=32)
    assert not bool(enc.fits.all())


def placed(g: GeometryV4, kind: str, base: int, groups, seed: int = 0):
    """One block: every value 4-bit (exponent base + 0..15, at most 255) except one value of each group
    ``(tile, lane, s)``, which makes it raw (16 + 37 k above the window mod 256, or just below it)."""
    gen = torch.Generator().manual_seed(seed)
    t, d = g.block_size, g.head_dim
    room = min(16, 256 - base)
    e = base + torch.randint(0, room, (t, d), generator=gen)
    sm = torch.randint(0, 256, (t, d), generator=gen)
    row, col = lane_coords(d, kind)
    for k, (tile, lane, s) in enumerate(groups):
        r, c = row[lane, 4 * s + k % 4, k % 2], col[lane, 4 * s + k % 4, k % 2]
        e[16 * tile + r, c] = (base + 16 + 37 * k) % 256 if base < 240 else base - 1 - k
    return bits_of(e, sm)[None], torch.full((d,), base, dtype=torch.uint8)


@pytest.mark.parametrize("kind", ["k", "v"])
@pytest.mark.parametrize("base", [0, 1, 119, 240, 241, 255])
def test_raw_group_limits(kind, base):
    g = GeometryV4(64, 64)
    cases = [  # (groups made raw, fits)
        ([], True),
        ([(0, 0, 0), (0, 31, 3), (0, 17, 2)], True),  # exactly 3 raw groups in a tile
        ([(t, 5 + t, t) for t in range(4)] + [(t, 9, 1) for t in range(4)] + [(3, 30, 3)], True),  # 3 in tile 3
        ([(1, 0, 0), (1, 1, 1), (1, 2, 2), (1, 3, 3)], False),  # 4 raw groups in one tile -> BF16
        ([(2, 7, 0), (2, 7, 3)], False),  # 2 raw groups in one lane -> BF16
    ]
    for groups, fits in cases:
        x, b16 = placed(g, kind, base, groups)
        enc = round_trip(x, b16, g, kind)
        assert bool(enc.fits[0]) == fits and int(enc.raw_groups[0]) == len(groups), (groups, base)


def test_exponent_window_edges_and_special_values():
    g = GeometryV4(16, 64)
    d = 64
    rows = []
    for base, offs in ((0, [0, 15]), (0, [16, 255]), (255, [0, 0]), (255, [1, 200]), (100, [15, 16]), (100, [0, -1]),
                       (241, [0, 14]), (240, [15, 15])):
        for o in offs:
            e = torch.full((16, d), base)
            e[3, 5] = (base + o) % 256
            rows.append((bits_of(e, torch.randint(0, 256, (16, d))), base))
    x = torch.stack([r[0] for r in rows])
    b16 = torch.tensor([r[1] for r in rows], dtype=torch.uint8)[:, None].expand(-1, d).contiguous()
    for kind in "kv":
        enc = round_trip(x, b16, g, kind)
        assert bool(enc.fits.all())
        want = [int(not (0 <= o < 16) or base + o > 255) for base, offs in
                ((0, [0, 15]), (0, [16, 255]), (255, [0, 0]), (255, [1, 200]), (100, [15, 16]), (100, [0, -1]),
                 (241, [0, 14]), (240, [15, 15])) for o in offs]
        assert enc.raw_groups.tolist() == want
    # NaN payloads, +-Inf, +-0, subnormals with window 0 (zeros, subnormals 4-bit) and 255 (Inf/NaN 4-bit)
    special = torch.tensor([0x7FC0, 0x7FC1, 0x7FFF, 0xFFFF, 0xFF81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F])
    gen = torch.Generator().manual_seed(1)
    x = special[torch.randint(0, special.numel(), (8, 16, d), generator=gen)].to(torch.int16).view(torch.bfloat16)
    for base in (0, 255, 128):
        for kind in "kv":
            round_trip(x, torch.full((d,), base, dtype=torch.uint8), g, kind)


# ---------------------------------------------------------------------------------------------
# (c) real SmolLM2 K/V
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_smollm2_kv(smollm2, wikitext_test):
    from gaac_hf.calibration.collect import run_chunks, tokenize
    from gaac_hf.calibration.v3 import load_table_v3

    model, tok = smollm2
    table = load_table_v3(SHIPPED)
    ids = tokenize(tok, wikitext_test, 512)[None, :512]
    g = GeometryV4(64, 64)
    fits = blocks = 0
    for _, keys, values in run_chunks(model, ids, progress=False):
        for li in (0, 14, 29):
            for kind, x in enumerate((keys[li], values[li])):
                b16 = table.bases(li, kind)[1]
                for h in range(x.shape[0]):
                    enc = round_trip(x[h].reshape(-1, 64, 64), b16[h], g, "kv"[kind])
                    fits, blocks = fits + int(enc.fits.sum()), blocks + enc.fits.numel()
    assert fits > 0.9 * blocks


# ---------------------------------------------------------------------------------------------
# (d) the byte layout, from the spec (format/v4.py's docstring), not from the codec
# ---------------------------------------------------------------------------------------------
def test_byte_layout_pinned():
    g = GeometryV4(16, 64)  # one tile
    assert (g.tile_bytes, g.code_offset, g.side_offset, g.block_bytes, g.raw_bytes) == (1568, 1024, 1536, 1568, 2048)
    base = 120
    gen = torch.Generator().manual_seed(3)
    sm = torch.randint(0, 256, (16, 64), generator=gen)
    e = base + torch.randint(0, 16, (16, 64), generator=gen)
    e[11, 27] = base + 0xA7  # the only raw group: lane 13, s 1 in both kinds (pair j 3, high value)
    x = bits_of(e, sm)[None]
    m = lambda r, c: int(sm[r, c]) & 0x7F  # noqa: E731
    sg = lambda r, c: int(sm[r, c]) >> 7  # noqa: E731
    c = lambda r, col: (int(e[r, col]) - base) & 0xFF  # noqa: E731
    lane = 13  # g 3, t 1
    for kind in "kv":
        data = encode_blocks_v4(x, torch.full((64,), base, dtype=torch.uint8), g, kind).data[0]
        u32 = lambda off: int.from_bytes(bytes(data[off : off + 4].tolist()), "little")  # noqa: E731,B023
        # sign/mantissa word k of a lane at byte 512 (k // 4) + 16 lane + 4 (k % 4): pair 2k's low value at
        # bits 0-6 / sign 15, high value 16-22 / 31; pair 2k+1's low 8-14 / 23, high 24-30 / 7
        if kind == "k":  # pair q = 4 s + j: row g + 8 (j & 1), cols 16 s + 2 t + 8 (j >> 1) + h; k 1 = pairs 2, 3
            k, (a0, a1, b0, b1) = 1, ((3, 10), (3, 11), (11, 10), (11, 11))
        else:  # rows 2 t + 8 (j >> 1) + h, col 16 s + g + 8 (j & 1); k 0 = pairs 0, 1
            k, (a0, a1, b0, b1) = 0, ((2, 3), (3, 3), (2, 11), (3, 11))
        want = (m(*a0) | sg(*a0) << 15 | m(*a1) << 16 | sg(*a1) << 31
                | m(*b0) << 8 | sg(*b0) << 23 | m(*b1) << 24 | sg(*b1) << 7)
        assert u32(512 * (k // 4) + 16 * lane + 4 * (k % 4)) == want
        # code word of group s 1 at 1024 + 16 lane + 4: low nibble of pair j's low value at bit 7 + 4 j, high
        # value's at 23 + 4 j, mod 32
        w = u32(1024 + 16 * lane + 4)
        assert (w >> 3) & 0xF == 0x7  # (11, 27), pair 3 high: bit 35 mod 32
        if kind == "k":
            assert (w >> 19) & 0xF == c(11, 26) & 0xF  # pair 3 low (row 11, col 26): bits 19-22
            assert ((w >> 31) | (w << 1)) & 0xF == c(3, 27) & 0xF  # pair 2 high (row 3, col 27): bits 31, 0, 1, 2
            assert (w >> 7) & 0xF == c(3, 18) & 0xF  # pair 0 low (row 3, col 18)
        else:
            assert (w >> 27) & 0xF == c(3, 27) & 0xF  # pair 1 high (row 2 + 1, col 16 + 3 + 8): bits 27-30
            assert (w >> 7) & 0xF == c(2, 19) & 0xF  # pair 0 low: row 2, col 16 + 3
        # side area at 1536: n_raw 1, 7 reserved zeros; record 0 at +8: high nibbles (pair 3's high value at
        # bit 27 + 12 = 39 mod 32 = 7), lane 13, s 1, u16 0; slots 1, 2 zero
        side = data[1536:1568].tolist()
        assert side[:8] == [1, 0, 0, 0, 0, 0, 0, 0]
        assert side[RAW_AT : RAW_AT + 8] == list((0xA << 7).to_bytes(4, "little")) + [13, 1, 0, 0]
        assert side[RAW_AT + 8 :] == [0] * 16
    # tiles back to back: a 2-tile block = its tiles' encodings concatenated
    g2 = GeometryV4(32, 64)
    x2 = torch.cat([x, x.flip(1)], 1)
    b = torch.full((64,), base, dtype=torch.uint8)
    d2 = encode_blocks_v4(x2, b, g2, "v").data[0]
    assert torch.equal(d2, torch.cat([encode_blocks_v4(t, b, g, "v").data[0] for t in (x, x.flip(1))]))


# ---------------------------------------------------------------------------------------------
# (e) no host synchronisation in the encoder and the packer
# ---------------------------------------------------------------------------------------------
class HostSync(AssertionError):
    pass


@contextlib.contextmanager
def no_host_sync():
    """Every way of reading a tensor value on the host raises (CUDA's sync debug mode needs a GPU)."""

    def refuse(name):
        def f(*a, **k):
            raise HostSync(f"host sync: {name}")
        return f

    def check_index(idx):
        for i in idx if isinstance(idx, tuple) else (idx,):
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                raise HostSync("host sync: boolean-mask indexing")

    get, put = torch.Tensor.__getitem__, torch.Tensor.__setitem__
    with pytest.MonkeyPatch.context() as mp:
        for name in ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__", "numpy",
                     "unique", "masked_select", "argwhere", "nonzero_static"):
            if hasattr(torch.Tensor, name):
                mp.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
        for name in ("nonzero", "unique", "masked_select", "argwhere", "unique_consecutive"):
            mp.setattr(torch, name, refuse(f"torch.{name}"))
        mp.setattr(torch.Tensor, "__getitem__", lambda self, idx: (check_index(idx), get(self, idx))[1])
        mp.setattr(torch.Tensor, "__setitem__", lambda self, idx, v: (check_index(idx), put(self, idx, v))[1])
        yield


def test_encode_and_pack_do_not_sync():
    g = GeometryV4(64, 128)
    x, _, b16 = adversarial_blocks(GeometryV3(64, 128), seed=1)
    pool = torch.zeros(64 * g.raw_bytes, dtype=torch.uint8)
    with no_host_sync():
        with pytest.raises(HostSync):  # the mock bites
            bool(x[0, 0, 0] > 0)
        with pytest.raises(HostSync):
            x[x > 0]
        with pytest.raises(HostSync):
            (x > 0).nonzero()
        for kind in "kv":
            enc = encode_blocks_v4(x, b16, g, kind)
            offs, end = pool_offsets(enc.fits, g, start=32)
            entries = pack_blocks_v4(enc, x, pool, offs)
            y = decode_pool_v4(pool, entries, b16, g, kind, validate=False)
            decode_blocks_v4(enc.data, b16, g, kind, validate=False)
            same = torch.equal(y.view(torch.int16), x.view(torch.int16))  # a C++ comparison, no sync path mocked
    assert same and bool(end == 32 + stored_lengths(enc.fits, g).sum())


# ---------------------------------------------------------------------------------------------
# (f) geometry
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [16, 32, 48, 80, 96, 100, 320, 0])
def test_head_dim_rejected(bad):
    with pytest.raises(ValueError, match="multiple of 64.*format v3"):
        GeometryV4(64, bad)


@pytest.mark.parametrize("bad", [8, 48, 100, 0, -16])
def test_block_size_rejected(bad):
    with pytest.raises(ValueError, match="power of two"):
        GeometryV4(bad, 64)


def test_geometry_sizes_and_versions():
    for t, d in ((16, 64), (64, 128), (128, 192), (64, 256)):
        g = GeometryV4(t, d)
        assert (g.tiles, g.pairs, g.ksteps) == (t // 16, d // 4, d // 16)
        assert (g.sm_offset, g.code_offset, g.side_offset, g.tile_bytes) == (0, 16 * d, 24 * d, 24 * d + 32)
        assert g.block_bytes == g.tiles * g.tile_bytes and g.block_bytes % 16 == 0 and g.raw_bytes == 2 * t * d
        assert g.to_dict()["format_version"] == FORMAT_VERSION == 4 and GeometryV4.from_dict(g.to_dict()) == g
    with pytest.raises(ValueError, match="version 3 is not supported by the v4 reader.*reads 4"):
        GeometryV4.from_dict(GeometryV3(64, 64).to_dict())
    with pytest.raises(ValueError, match="version None"):
        GeometryV4.from_dict({"block_size": 64, "head_dim": 64})
    with pytest.raises(ValueError, match="version 4 is not supported by the v3 reader"):
        GeometryV3.from_dict(GeometryV4(64, 64).to_dict())


def test_bad_inputs_rejected():
    g = GeometryV4(16, 64)
    x = torch.zeros(2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kind"):
        encode_blocks_v4(x, torch.zeros(64, dtype=torch.uint8), g, "q")
    with pytest.raises(TypeError, match="uint8"):
        encode_blocks_v4(x, torch.zeros(64, dtype=torch.int32), g, "k")
    with pytest.raises(ValueError, match="shape"):
        encode_blocks_v4(x, torch.zeros(3, 64, dtype=torch.uint8), g, "k")
    with pytest.raises(TypeError, match="bfloat16"):
        encode_blocks_v4(x.float(), torch.zeros(64, dtype=torch.uint8), g, "k")
    enc = encode_blocks_v4(x, torch.zeros(64, dtype=torch.uint8), g, "k")
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_blocks_v4(enc, x, torch.zeros(10008, dtype=torch.uint8), torch.tensor([0, 2048]))


# ---------------------------------------------------------------------------------------------
# validation of stored blocks
# ---------------------------------------------------------------------------------------------
def test_structurally_impossible_blocks_rejected():
    g = GeometryV4(16, 64)
    x, b16 = placed(g, "k", 119, [(0, 4, 1), (0, 9, 2)])
    enc = encode_blocks_v4(x, b16, g, "k")
    assert bool(enc.fits[0])
    side, rec = g.side_offset, g.record_offset
    corruptions = {
        "n_raw 4": [(side, 4)],
        "reserved header byte": [(side + 5, 1)],
        "lane 32": [(rec(0) + 4, 32)],
        "k-step 4": [(rec(1) + 5, 4)],
        "record reserved u16": [(rec(0) + 7, 1)],
        "unused slot not zero": [(rec(2) + 1, 3)],
        "two records for lane 4": [(rec(1) + 4, 4)],
    }
    for what, edits in corruptions.items():
        d = enc.data.clone()
        for off, v in edits:
            d[0, off] = v
        with pytest.raises(ValueError, match="corrupt GAAC v4"):
            decode_blocks_v4(d, b16, g, "k")
            pytest.fail(what)
        decode_blocks_v4(d, b16, g, "k", validate=False)  # the kernel's reading: no error
        pool = torch.cat([d[0], torch.zeros(g.raw_bytes - g.block_bytes + GUARD, dtype=torch.uint8)])
        with pytest.raises(ValueError, match="corrupt GAAC v4"):
            decode_pool_v4(pool, torch.tensor([0]), b16, g, "k")
        decode_pool_v4(pool, torch.tensor([1]), b16, g, "k")  # the same bytes read as a BF16 block: fine
    # a group without a record must be 4-bit: base16 + code <= 255 (here: codes up to 15 read with window 250)
    with pytest.raises(ValueError, match="corrupt GAAC v4"):
        decode_blocks_v4(enc.data, torch.full((64,), 250, dtype=torch.uint8), g, "k")
    pool = torch.zeros(4096, dtype=torch.uint8)
    for bad in ([8], [-16], [4096 - 1568 + 16], [4096 - 2048 + 17]):
        with pytest.raises(ValueError, match="block table"):
            decode_pool_v4(pool, torch.tensor(bad), b16, g, "k")


# ---------------------------------------------------------------------------------------------
# (g) mutation check: one flipped bit of a stored field changes exactly one decoded value
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["k", "v"])
def test_flipped_bits_change_the_decode(kind):
    g = GeometryV4(32, 128)
    x, b16 = placed(g, kind, 110, [(1, 6, 5), (1, 20, 0), (0, 31, 7)])
    enc = encode_blocks_v4(x, b16, g, kind)
    assert bool(enc.fits[0]) and int(enc.raw_groups[0]) == 3
    same_bits(decode_blocks_v4(enc.data, b16, g, kind), x)
    tb = g.tile_bytes
    flips = {  # (byte, bit) -> values that must change
        "sign/mantissa plane": [(100, 3), (tb + 2047, 7), (5, 7)],
        "code plane": [(g.code_offset + 77, 0), (tb + g.code_offset + 511, 6), (g.code_offset + 4 * 7 + 16 * 31, 3)],
        "raw record": [(tb + g.record_offset(0) + 2, 5), (g.record_offset(0), 0), (tb + g.record_offset(1) + 3, 7)],
    }
    for field, places in flips.items():
        for byte, bit in places:
            d = enc.data.clone()
            d[0, byte] ^= 1 << bit
            y = decode_blocks_v4(d, b16, g, kind, validate=False)
            diff = int((y.view(torch.int16) != x.view(torch.int16)).sum())
            assert diff == 1, (field, byte, bit, diff)
            with pytest.raises(AssertionError):
                same_bits(y, x)
    # a record moved to another lane changes values of both groups (and is still structurally valid)
    d = enc.data.clone()
    d[0, g.record_offset(0) + 4] ^= 1
    assert int((decode_blocks_v4(d, b16, g, kind).view(torch.int16) != x.view(torch.int16)).sum()) > 1
