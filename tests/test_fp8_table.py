"""FP8 calibration tables (gaac_hf.calibration.fp8): the file round-trips, and every wrong or mismatched
file, dtype or argument fails with a message that says what to do. No model weights: a tiny config."""
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from gaac_hf import GAACCache
from gaac_hf.calibration import CalibrationTable, FP8Table, model_kv_shape
from gaac_hf.calibration.fp8 import is_fp8_table
from gaac_hf.format import BlockGeometry
from gaac_hf.format.fp8 import GeometryFP8

L, H, D = 2, 1, 64


def config(**kw):
    return LlamaConfig(num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=H, head_dim=D,
                       hidden_size=128, intermediate_size=64, vocab_size=32, **kw)


def fp8_table(dtype="fp8_e4m3", block=16, **meta) -> FP8Table:
    g = GeometryFP8(block, D, dtype)
    shape = (L, 2, H, D)
    scales = torch.tensor([[0.01, 0.002], [0.03, 0.004]], dtype=torch.float32)
    return FP8Table(scales, torch.full(shape, min(5, g.max_base_narrow), dtype=torch.uint8),
                    torch.full(shape, g.max_base_wide, dtype=torch.uint8), g,
                    {"kv_shape": model_kv_shape(config()), "model_name": "tiny"} | meta)


def bf16_table() -> CalibrationTable:
    shape = (L, 2, H, D)
    return CalibrationTable(torch.full(shape, 120, dtype=torch.uint8), torch.full(shape, 116, dtype=torch.uint8),
                            BlockGeometry(16, D), {"kv_shape": model_kv_shape(config())})


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_round_trip_keeps_every_bit(tmp_path, dtype):
    t = fp8_table(dtype)
    t.base_n[1, 0, 0, 3] = 0  # not all equal
    path = t.save(tmp_path / "t.safetensors")
    u = FP8Table.load(path, kv_dtype=dtype)
    assert u.dtype == dtype and u.geometry == t.geometry and u.meta == t.meta
    assert torch.equal(u.scales.view(torch.int32), t.scales.view(torch.int32))
    assert torch.equal(u.base_n, t.base_n) and torch.equal(u.base_w, t.base_w)
    assert is_fp8_table(path) and not is_fp8_table(bf16_table().save(tmp_path / "b.safetensors"))


def test_the_wrong_kind_of_table_is_named_both_ways(tmp_path):
    bf16 = bf16_table().save(tmp_path / "bf16.safetensors")
    fp8 = fp8_table().save(tmp_path / "fp8.safetensors")
    with pytest.raises(ValueError, match=r"BF16 calibration table .*gaac-calibrate --kv-dtype fp8_e5m2"):
        FP8Table.load(bf16, kv_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"FP8 calibration table .*FP8Table.load.*kv_dtype="):
        CalibrationTable.load(fp8)
    # the same through GAACCache, by path and as objects
    with pytest.raises(ValueError, match=r"BF16 calibration table"):
        GAACCache(config(), calibration=str(bf16), kv_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match=r"got a BF16 CalibrationTable.*--kv-dtype fp8_e4m3"):
        GAACCache(config(), calibration=bf16_table(), kv_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match=r"FP8 calibration table"):
        GAACCache(config(), calibration=str(fp8))  # kv_dtype defaults to bf16
    with pytest.raises(ValueError, match=r"FP8 calibration table \(fp8_e4m3\): pass kv_dtype='fp8_e4m3'"):
        GAACCache(config(), calibration=fp8_table())


def test_a_table_of_the_other_fp8_format_is_refused(tmp_path):
    path = fp8_table("fp8_e4m3").save(tmp_path / "e4m3.safetensors")
    with pytest.raises(ValueError, match=r"for fp8_e4m3, but kv_dtype='fp8_e5m2'.*--kv-dtype fp8_e5m2"):
        FP8Table.load(path, kv_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"for fp8_e4m3, but kv_dtype='fp8_e5m2'"):
        GAACCache(config(), calibration=str(path), kv_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"for fp8_e5m2, but kv_dtype='fp8_e4m3'"):
        GAACCache(config(), calibration=fp8_table("fp8_e5m2"), kv_dtype="fp8_e4m3")


def _rewrite(path, out, header_edit=None, tensors_edit=None):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        md, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    header = json.loads(md["gaac_fp8"])
    if header_edit:
        header_edit(header)
    if tensors_edit:
        tensors_edit(tensors)
    save_file(tensors, str(out), metadata={"gaac_fp8": json.dumps(header)})
    return out


@pytest.mark.parametrize("edit, match", [
    (lambda h: h.update(table_version=2), r"version 2; this gaac-hf reads version 1"),
    (lambda h: h.update(scale="per-head"), r"granularity 'per-head'"),
    (lambda h: h.update(dtype="fp8_e5m2"), r"header says dtype 'fp8_e5m2' but its geometry 'fp8_e4m3'"),
    (lambda h: h["geometry"].update(format_version=2), r"geometry.*format version 2 has no FP8 tiles"),
    (lambda h: h["geometry"].update(dtype="bf16"), r"geometry.*not an FP8 tile header"),
    (lambda h: h.pop("geometry"), r"'geometry' is missing"),
    (lambda h: h.update(table="something"), r"does not describe a gaac-fp8 table"),
])
def test_a_damaged_header_names_what_is_wrong(tmp_path, edit, match):
    path = fp8_table().save(tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match=match):
        FP8Table.load(_rewrite(path, tmp_path / "bad.safetensors", header_edit=edit))


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.__setitem__("scales", torch.tensor([[0.1, float("nan")], [0.1, 0.1]])), r"finite and > 0"),
    (lambda t: t.__setitem__("scales", torch.zeros(2, 2)), r"finite and > 0"),
    (lambda t: t.__setitem__("scales", torch.ones(2, 2, 1)), r"float32 \[2, 2\].*per-tensor"),
    (lambda t: t.__setitem__("scales", torch.ones(2, 2, dtype=torch.float64)), r"float32 \[2, 2\]"),
    (lambda t: t["base_n"].fill_(9), r"base_n <= 8, got 9"),  # E4M3 narrow windows end at exponent 15
    (lambda t: t["base_w"].fill_(1), r"base_w <= 0, got 1"),  # E4M3's wide window is the whole field
    (lambda t: t.pop("base_w"), r"holds tensors"),
])
def test_damaged_tensors_are_refused(tmp_path, edit, match):
    path = fp8_table().save(tmp_path / "t.safetensors")
    with pytest.raises(ValueError, match=match):
        FP8Table.load(_rewrite(path, tmp_path / "bad.safetensors", tensors_edit=edit))


def test_not_a_table_and_no_file(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"not a GAAC FP8 calibration table"):
        FP8Table.load(junk)
    with pytest.raises(FileNotFoundError, match=r"no calibration table at"):
        GAACCache(config(), calibration=str(tmp_path / "missing.safetensors"), kv_dtype="fp8_e4m3")


def test_a_table_for_another_model_is_refused():
    with pytest.raises(ValueError, match=r"FP8 \(fp8_e4m3\) calibration table .*num_layers: table 2 vs model 3.*--kv-dtype fp8_e4m3"):
        GAACCache(LlamaConfig(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=H, head_dim=D,
                              hidden_size=128, intermediate_size=64, vocab_size=32),
                  calibration=fp8_table(), kv_dtype="fp8_e4m3")


@pytest.mark.parametrize("kw, match", [
    ({"kv_dtype": "fp8"}, r"kv_dtype must be one of \('bf16', 'fp8_e4m3', 'fp8_e5m2'\), got 'fp8'"),
    ({"kv_dtype": torch.float8_e4m3fn}, r"kv_dtype must be one of"),
    ({"kv_dtype": "fp8_e4m3", "checksums": True}, r"checksums=True is not implemented for FP8"),
    ({"kv_dtype": "fp8_e4m3", "format_version": 2}, r"format v3 FP8 tiles; format_version=2"),
    ({"kv_dtype": "fp8_e4m3", "return_full_kv": False}, r"always returns the dequantized K/V"),
])
def test_bad_arguments_are_actionable(kw, match):
    with pytest.raises(ValueError, match=match):
        GAACCache(config(), calibration=fp8_table(), **kw)


def test_no_table_says_how_to_make_one():
    with pytest.raises(ValueError, match=r"kv_dtype='fp8_e5m2'.*gaac-calibrate --kv-dtype fp8_e5m2"):
        GAACCache(config(), kv_dtype="fp8_e5m2")


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_shipped_fp8_tables_load_by_name_and_fit_smollm2(dtype):
    from transformers import AutoConfig

    from gaac_hf.calibration import find_table
    from gaac_hf.models import smollm2_dir

    t = FP8Table.load(find_table(f"smollm2-135m-{dtype}"), kv_dtype=dtype)
    t.check_model(AutoConfig.from_pretrained(smollm2_dir()))
    assert t.meta["command"].startswith(f"gaac-calibrate --model smollm2 --kv-dtype {dtype}")
