"""Lab check (not part of the product's test suite): the per-row escape-offset decoder experiment
(``lab/experiments/decode_rowoff.py``) against the reference codec, on the CPU interpreter.
Run from the repository root: ``TRITON_INTERPRET=1 python -m pytest -q lab/test_experiments.py``."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent / "experiments"))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_row_offset_decoder_is_bit_exact(d):
    import decode_rowoff

    assert decode_rowoff._check_cpu_dim(d)


# ---------------------------------------------------------------------------------------------------------
# register tiles (lab/experiments/regtile): the layouts' reference codecs round-trip every bit
# ---------------------------------------------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parent / "experiments" / "regtile"))


def _kv_with_patterns(D, kind, seed):
    import torch
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv

    x = synthetic_kv((1, 1, 1024 * 16, D), kind, seed)[0, 0]
    b8, b16 = calibrate(x[None, None])
    tiles = x.reshape(-1, 16, D).clone()
    g = torch.Generator().manual_seed(seed)
    n = tiles.shape[0]
    # 1,024 arbitrary 16-bit patterns (NaN payloads, Inf, zeros, subnormals) plus every pattern of one high byte
    pats = torch.cat([torch.randint(-32768, 32768, (768,), generator=g), torch.arange(256) - 128 + (0x7F << 8)]).to(torch.int16)
    ti = torch.arange(pats.numel()) % n
    r, c = torch.randint(0, 16, (pats.numel(),), generator=g), torch.randint(0, D, (pats.numel(),), generator=g)
    tiles.view(torch.int16)[ti, r, c] = pats
    return tiles.reshape(-1, 64, D), b8[0], b16[0]


@pytest.mark.parametrize("layout", ["format", "format4", "format4i"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kind", ["k", "v"])
def test_register_tile_layouts_round_trip(layout, D, kind):
    import importlib

    import torch

    F = importlib.import_module(layout)
    blocks, b8, b16 = _kv_with_patterns(D, kind, 5)
    enc = F.encode(blocks, b8, b16, kind)
    assert enc.data.shape == (blocks.shape[0], F.Geometry(D).block_bytes)
    assert enc.fits.sum() >= 64, "enough blocks must fit the layout to be checked"  # (3-bit d=64: ~1/3 fit here)
    assert (enc.modes == 2).any(), "the data must exercise raw groups"
    dec = F.decode(enc.data[enc.fits], b8, b16, D, kind)
    assert torch.equal(dec.view(torch.int16), blocks[enc.fits].view(torch.int16))


def test_format4_rotated_codes_are_what_the_kernel_extracts():
    """regtile.cu (FMT4) takes pair j's codes as rotr(w, 4j) & 0x07800780 and a raw group's high nibbles as
    rotr(h, 4j) & 0x78007800: check both against the layout's own unpacking, and that a wrong rotation fails."""
    import torch
    import format4 as F4

    w = torch.randint(0, 2**32, (4096,), dtype=torch.int64, generator=torch.Generator().manual_seed(0))
    nib = F4._unpack(w, 7)
    assert torch.equal(F4._pack(nib, 7), w)
    for j in range(4):
        want = (nib[:, j, 0] << 7) | (nib[:, j, 1] << 23)
        assert torch.equal(F4._rotr(w, 4 * j) & F4.CODE_MASK, want)
        assert torch.equal(F4._rotr(F4._pack(nib, 11), 4 * j) & F4.HIGH_MASK, want << 4)
        if j:  # mutation: the rotation of the previous pair gives other codes
            assert not torch.equal(F4._rotr(w, 4 * (j - 1)) & F4.CODE_MASK, want)


@pytest.fixture(scope="module")
def f4_host(tmp_path_factory):
    """f4_host.cpp on f4_pair.h (the kernel's pair logic) built with g++ into a shared library."""
    import ctypes
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    here = Path(__file__).resolve().parent
    so = tmp_path_factory.mktemp("f4") / "f4_host.so"
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{here.parent / 'kernels' / 'cuda'}",
                    str(here / "experiments" / "regtile" / "f4_host.cpp"), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("layout", ["format4", "format4i"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kind", ["k", "v"])
def test_f4_pair_logic_matches_the_reference_on_the_host(f4_host, layout, D, kind):
    """The kernel's F4 bit logic (f4_pair.h), compiled by g++, rebuilds every value of every fitting tile exactly,
    raw groups included, on KV-like data with injected BF16 patterns (poisoned output first)."""
    import ctypes
    import importlib

    import torch

    F = importlib.import_module(layout)
    blocks, b8, b16 = _kv_with_patterns(D, kind, 11)
    enc = F.encode(blocks, b8, b16, kind)
    data = enc.data[enc.fits].contiguous()
    n_tiles = data.shape[0] * 4
    assert (enc.modes[enc.fits] == 2).any(), "raw groups must be exercised"
    out = torch.full((n_tiles, 16, D), -1, dtype=torch.int16)
    b16c = b16.to(torch.uint8).contiguous()
    f4_host.f4_decode_tiles(ctypes.c_void_p(data.data_ptr()), ctypes.c_int64(n_tiles),
                            ctypes.c_int64(F.Geometry(D).tile_bytes), ctypes.c_void_p(b16c.data_ptr()), D,
                            int(kind == "v"), int(layout == "format4i"), ctypes.c_void_p(out.data_ptr()))
    assert torch.equal(out.view(-1, 64, D), blocks[enc.fits].view(torch.int16))


def test_register_tile_layouts_on_real_kv(f4_host):
    """Real SmolLM2 K/V (held-out WikiText-2 text, the shipped windows; model from its PyPI wheel, offline): every
    layer's K and V blocks round-trip bit for bit through both layouts' reference codecs and, for F4i, through
    the kernel's pair logic on the host."""
    import ctypes

    import format as F3
    import format4i as F4i
    import torch
    from gaac_hf.calibration.collect import run_chunks, split_chunks, tokenize
    from gaac_hf.calibration.v3 import load_table_v3
    from gaac_hf.models import load_named_model

    repo = Path(__file__).resolve().parent.parent
    text = repo.parent / "shared" / "data" / "wikitext-2-raw-v1" / "wiki.test.raw"
    if not text.exists():
        pytest.skip(f"{text} not found")
    model, tok, _ = load_named_model("smollm2", dtype=torch.bfloat16)
    table = load_table_v3(repo / "calibration_data" / "smollm2-135m.safetensors")
    chunks = split_chunks(tokenize(tok, text.read_text(encoding="utf-8"), 1024), 1024, 64)
    checked = 0
    for _, keys, values in run_chunks(model, chunks[:1], progress=False):
        for li in range(len(keys)):
            for kind, x in ((0, keys[li]), (1, values[li])):
                b8, b16 = table.bases(li, kind)
                for h in range(x.shape[0]):
                    blocks = x[h, : x.shape[1] // 64 * 64].reshape(-1, 64, x.shape[2]).contiguous()
                    for F in (F3, F4i):
                        enc = F.encode(blocks, b8[h], b16[h], "kv"[kind])
                        dec = F.decode(enc.data[enc.fits], b8[h], b16[h], x.shape[2], "kv"[kind])
                        assert torch.equal(dec.view(torch.int16), blocks[enc.fits].view(torch.int16))
                        checked += int(enc.fits.sum())
                    data = enc.data[enc.fits].contiguous()
                    out = torch.full((data.shape[0] * 4, 16, x.shape[2]), -1, dtype=torch.int16)
                    b16c = b16[h].to(torch.uint8).contiguous()
                    f4_host.f4_decode_tiles(ctypes.c_void_p(data.data_ptr()), ctypes.c_int64(data.shape[0] * 4),
                                            ctypes.c_int64(F4i.Geometry(x.shape[2]).tile_bytes),
                                            ctypes.c_void_p(b16c.data_ptr()), x.shape[2], kind, 1,
                                            ctypes.c_void_p(out.data_ptr()))
                    assert torch.equal(out.view(-1, 64, x.shape[2]), blocks[enc.fits].view(torch.int16))
    assert checked > 1000
