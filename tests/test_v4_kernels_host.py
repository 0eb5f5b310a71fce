"""The v4 pair bit logic of the CUDA kernel (``kernels/cuda/gaac_v4/pair.cuh``), compiled by g++ on the host
(``gaac_v4/host_decode.cpp`` walks a tile as the kernel's LaneTile does), against the reference codec
(``gaac_hf.codec.v4``): every BF16 pattern, raw groups, real-K/V-like data, both kinds. A planted bit change in
pair.cuh must make it fail (mutation check)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
from gaac_hf.codec.v4 import encode_blocks_v4
from gaac_hf.format.v4 import GeometryV4

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "kernels" / "cuda"
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _build(dest: Path, pair_text: str | None = None) -> ctypes.CDLL:
    inc = dest / "inc"
    (inc / "gaac_v4").mkdir(parents=True, exist_ok=True)
    (inc / "gaac_v3").mkdir(parents=True, exist_ok=True)
    shutil.copy(CUDA_DIR / "gaac_v3" / "core.cuh", inc / "gaac_v3" / "core.cuh")
    (inc / "gaac_v4" / "pair.cuh").write_text(pair_text or (CUDA_DIR / "gaac_v4" / "pair.cuh").read_text())
    so = dest / "v4host.so"
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{inc}", "-o", str(so),
                    str(CUDA_DIR / "gaac_v4" / "host_decode.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("v4host"))


def _host_decode(lib, data: torch.Tensor, b16: torch.Tensor, g: GeometryV4, kind: str) -> torch.Tensor:
    """data uint8 [N, block_bytes] (one window set b16 [D]) -> int16 [N, T, D] by the host walk."""
    n_tiles = data.shape[0] * g.tiles
    out = torch.empty(n_tiles, 16, g.head_dim, dtype=torch.int16)
    data, b16 = data.contiguous(), b16.contiguous()
    lib.gaac_v4_host_decode_tiles(ctypes.c_void_p(data.data_ptr()), ctypes.c_int64(n_tiles), ctypes.c_void_p(b16.data_ptr()),
                                  ctypes.c_int(g.head_dim), ctypes.c_int(kind == "v"), ctypes.c_void_p(out.data_ptr()))
    return out.reshape(data.shape[0], g.block_size, g.head_dim)


def _cases(D: int, kind: str, seed: int = 0):
    """KV-like blocks with their windows, every BF16 pattern among them, and scattered far values (raw groups)."""
    g = torch.Generator().manual_seed(seed)
    x = synthetic_kv((1, 1, 64 * 24, D), kind, seed)[0, 0].reshape(24, 64, D).clone()
    b16 = calibrate(x.reshape(1, 1, -1, D))[1][0]
    bits = x.view(torch.int16).view(-1)
    idx = torch.randint(0, bits.numel(), (bits.numel() // 5000,), generator=g)  # ~0.4 per 16-token tile at d=128
    bits[idx] = torch.randint(-32768, 32767, (idx.numel(),), generator=g, dtype=torch.int16)
    pats = torch.arange(65536, dtype=torch.int64)[torch.randperm(65536, generator=g)].to(torch.int16)
    allp = pats.repeat(-(-64 * D * 16 // 65536))[: 64 * D * 16].view(torch.bfloat16).reshape(16, 64, D)
    return torch.cat([x, allp]), b16


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kind", ["k", "v"])
def test_host_pair_logic_matches_the_reference(host, D, kind):
    g = GeometryV4(block_size=64, head_dim=D)
    x, b16 = _cases(D, kind, seed=D)
    enc = encode_blocks_v4(x, b16, g, kind)
    fits = enc.fits
    assert int(fits.sum()) >= 10, "most KV-like blocks fit"
    got = _host_decode(host, enc.data[fits], b16, g, kind)
    assert torch.equal(got, x[fits].view(torch.int16))


def test_raw_groups_are_exercised_and_decoded(host):
    g = GeometryV4(block_size=64, head_dim=128)
    x, b16 = _cases(128, "k", seed=3)
    enc = encode_blocks_v4(x, b16, g, "k")
    assert int(enc.raw_groups[enc.fits].sum()) > 20  # blocks that fit with raw groups in their tiles
    assert torch.equal(_host_decode(host, enc.data[enc.fits], b16, g, "k"), x[enc.fits].view(torch.int16))


@pytest.mark.parametrize("mutation", [
    ("constexpr uint32_t CODE_MASK = 0x07800780u;", "constexpr uint32_t CODE_MASK = 0x07800380u;"),
    ("return (q & 1) ? rotr(smw, 8) : smw;", "return (q & 1) ? rotr(smw, 7) : smw;"),
    ("const uint32_t fh = rotr(hw, 4 * j) & HIGH_MASK;", "const uint32_t fh = rotr(hw, 4 * j + 4) & HIGH_MASK;"),
])
def test_planted_bit_errors_fail(tmp_path, mutation):
    text = (CUDA_DIR / "gaac_v4" / "pair.cuh").read_text()
    assert mutation[0] in text
    lib = _build(tmp_path, text.replace(mutation[0], mutation[1]))
    g = GeometryV4(block_size=64, head_dim=128)
    x, b16 = _cases(128, "v", seed=5)
    enc = encode_blocks_v4(x, b16, g, "v")
    got = _host_decode(lib, enc.data[enc.fits], b16, g, "v")
    assert not torch.equal(got, x[enc.fits].view(torch.int16))
