"""The v3 reference codec and geometry: round trips (int16 bits), sizes, pool/entries, validation,
version handling and the v2 table upgrade."""
import json

import pytest
import torch

from gaac_hf.codec.v3 import (
    decode_blocks_v3, decode_pool_v3, encode_blocks_v3, pack_blocks, pack_code_words, stored_bytes, unpack_code_words,
)
from gaac_hf.format.v3 import ENTRY_RAW, FORMAT_VERSION, GeometryV3
from gaac_hf.calibration.v3 import TableV3, load_table_v3
from tests.v3_cases import adversarial_blocks, same_bits

SHIPPED = "calibration_data/smollm2-135m.safetensors"


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 80, 96, 112, 128, 144, 192, 256])
def test_any_head_dim_multiple_of_16(head_dim):
    g = GeometryV3(64, head_dim)
    x, b8, b16 = adversarial_blocks(g, seed=head_dim)
    enc = encode_blocks_v3(x, b8, b16, g)
    pool, entries = pack_blocks(enc, x)
    same_bits(decode_pool_v3(pool, entries, b8, b16, g), x)
    f = enc.fits
    same_bits(decode_blocks_v3(enc.data[f], b8[f], b16[f], g), x[f])
    # the stored length follows from the mode counts alone
    m = enc.modes.reshape(x.shape[0], -1)
    want = torch.tensor([g.block_bytes(int((r > 0).sum()), int((r == 2).sum())) for r in m], dtype=torch.int32)
    assert torch.equal(enc.nbytes, want)
    assert int(pool.numel()) == int(torch.where(f, enc.nbytes.long(), g.raw_bytes).sum())
    assert bool(((entries & ENTRY_RAW) == (~f).long()).all()) and bool((entries % 16 <= 1).all())


@pytest.mark.parametrize("bad", [8, 72, 100, 264, 0, 272])
def test_head_dim_rejected(bad):
    with pytest.raises(ValueError, match="multiple of 16"):
        GeometryV3(64, bad)


@pytest.mark.parametrize("bad", [8, 48, 100])
def test_block_size_rejected(bad):
    with pytest.raises(ValueError, match="power of two"):
        GeometryV3(bad, 64)


def test_code_word_layout_and_inverse():
    gen = torch.Generator().manual_seed(0)
    lo3 = torch.randint(0, 8, (100, 4, 8), generator=gen, dtype=torch.int32)
    w = pack_code_words(lo3)
    assert bool((w < 2**32).all()) and bool((w >= 0).all())
    assert torch.equal(unpack_code_words(w), lo3)
    one = torch.zeros(1, 4, 8, dtype=torch.int32)
    one[0, 3, 7] = 5  # pair 15 (row 3, channels 6/7), odd channel, bits 0 and 2
    assert pack_code_words(one).tolist() == [[1 << 31, 0, 1 << 31]]
    one = torch.zeros(1, 4, 8, dtype=torch.int32)
    one[0, 1, 2] = 3  # pair 5 = row 1, p = 1 -> word 1, shift 0, even channel
    assert pack_code_words(one).tolist() == [[0, 3, 0]]


def test_all_3bit_block_has_no_entries_and_wide_groups_cost_2_or_6_bytes():
    g = GeometryV3(64, 64)
    x = torch.full((3, 64, 64), 1.5, dtype=torch.bfloat16)  # exponent 127
    x[1, 5, 9] = 3.0  # exponent 128: outside [121, 128) -> 4-bit group
    x[2, 7, 0] = 1e30  # far outside both windows -> raw group
    b8 = torch.full((64,), 120, dtype=torch.uint8)
    b16 = torch.full((64,), 118, dtype=torch.uint8)
    enc = encode_blocks_v3(x, b8, b16, g)
    assert enc.nbytes.tolist() == [g.block_bytes(0, 0), g.block_bytes(1, 0), g.block_bytes(1, 1)]
    assert [int((m > 0).sum()) for m in enc.modes] == [0, 1, 1] and int(enc.modes[2].max()) == 2
    same_bits(decode_blocks_v3(enc.data, b8, b16, g), x)
    assert stored_bytes(enc, g).tolist() == [n + 8 for n in enc.nbytes.tolist()]


def test_corrupt_blocks_rejected():
    g = GeometryV3(64, 64)
    x, b8, b16 = adversarial_blocks(g)
    enc = encode_blocks_v3(x, b8, b16, g)
    i = int(enc.fits.nonzero()[0])
    row = enc.data[i : i + 1].clone()
    row[0, g.segtab_offset + 4 : g.segtab_offset + 6] = torch.tensor([0xFF, 0x7F], dtype=torch.uint8)  # segment count too large
    with pytest.raises(ValueError, match="corrupt"):
        decode_blocks_v3(row, b8[i], b16[i], g)
    with pytest.raises(ValueError, match="16-byte"):
        decode_pool_v3(enc.data[i], torch.tensor([3]), b8[i], b16[i], g)


def test_v2_geometry_refused_and_v3_round_trip():
    g = GeometryV3(64, 128)
    assert GeometryV3.from_dict(g.to_dict()) == g and g.to_dict()["format_version"] == FORMAT_VERSION == 3
    with pytest.raises(ValueError, match="version 2 is not supported.*windows carry over"):
        GeometryV3.from_dict({"block_size": 64, "head_dim": 64, "group_axis": "channel", "format_version": 2})
    with pytest.raises(ValueError, match="not BF16 tiles.*GeometryFP8"):
        GeometryV3.from_dict(g.to_dict() | {"dtype": "fp8_e4m3"})
    with pytest.raises(ValueError, match="channels only"):
        GeometryV3.from_dict(g.to_dict() | {"group_axis": "token"})


def test_shipped_v2_table_upgrades_with_windows_kept(tmp_path):
    from gaac_hf.calibration import CalibrationTable

    v2 = CalibrationTable.load(SHIPPED)
    t = load_table_v3(SHIPPED)
    assert torch.equal(t.base8, v2.base8) and torch.equal(t.base16, v2.base16)
    assert t.meta["upgraded_from"]["format_version"] == 2 and t.geometry == GeometryV3(64, 64)
    with pytest.raises(ValueError, match="upgrade=True"):
        load_table_v3(SHIPPED, upgrade=False)
    p = t.save(tmp_path / "v3.safetensors")
    back = load_table_v3(p)
    assert torch.equal(back.base8, t.base8) and back.meta["upgraded_from"] == t.meta["upgraded_from"]
    # the v2 reader refuses the v3 file (its own version check)
    with pytest.raises(ValueError, match="version 3"):
        CalibrationTable.load(p)
    from safetensors import safe_open

    with safe_open(str(p), framework="pt") as f:
        assert json.loads(f.metadata()["gaac"])["format_version"] == 3


def test_table_rejects_out_of_range_bases():
    b = torch.full((1, 2, 1, 64), 249, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out of range"):
        TableV3(b, b.clone() - 9, GeometryV3(64, 64))
