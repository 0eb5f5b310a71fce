"""The v3 C++ core (kernels/cuda/gaac_v3/core.cuh), compiled by g++, against the PyTorch reference
(gaac_hf/codec/v3.py): decoder bit for bit, encoder byte for byte.

The driver is built once per session in a temp dir; blocks and outputs travel as raw files.
A mutation check (one shift of the core changed, rebuilt) must make the comparison fail.
"""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gaac_hf.codec.v3 import decode_pool_v3, encode_blocks_v3, pack_blocks
from gaac_hf.format.v3 import GeometryV3
from tests.host_core import CORE_DIR, build
from tests.v3_cases import adversarial_blocks, every_pattern_blocks, same_bits

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("v3core"))


def _bases(b, n, d):
    b = b if b.dim() == 2 else b.unsqueeze(0)
    return b.expand(n, d).contiguous()


def host_decode(exe: Path, data: torch.Tensor, b8, b16, g: GeometryV3, tmp: Path) -> torch.Tensor:
    n = data.shape[0]
    (tmp / "blk.bin").write_bytes(data.contiguous().numpy().tobytes())
    (tmp / "b8.bin").write_bytes(_bases(b8, n, g.head_dim).numpy().tobytes())
    (tmp / "b16.bin").write_bytes(_bases(b16, n, g.head_dim).numpy().tobytes())
    subprocess.run([str(exe), "decode", str(g.block_size), str(g.head_dim), str(n), str(data.shape[1]),
                    *(str(tmp / f) for f in ("blk.bin", "b8.bin", "b16.bin", "out.bin"))], check=True)
    out = torch.frombuffer(bytearray((tmp / "out.bin").read_bytes()), dtype=torch.int16)
    return out.reshape(n, g.block_size, g.head_dim).view(torch.bfloat16)


def host_encode(exe: Path, x: torch.Tensor, b8, b16, g: GeometryV3, tmp: Path):
    n = x.shape[0]
    (tmp / "x.bin").write_bytes(x.contiguous().view(torch.int16).numpy().tobytes())
    (tmp / "b8.bin").write_bytes(_bases(b8, n, g.head_dim).numpy().tobytes())
    (tmp / "b16.bin").write_bytes(_bases(b16, n, g.head_dim).numpy().tobytes())
    subprocess.run([str(exe), "encode", str(g.block_size), str(g.head_dim), str(n),
                    *(str(tmp / f) for f in ("x.bin", "b8.bin", "b16.bin", "rows.bin", "nb.bin"))], check=True)
    rows = torch.frombuffer(bytearray((tmp / "rows.bin").read_bytes()), dtype=torch.uint8).reshape(n, g.raw_bytes)
    nb = torch.frombuffer(bytearray((tmp / "nb.bin").read_bytes()), dtype=torch.int32)
    return rows, nb


def check_both(exe, x, b8, b16, g, tmp):
    """Reference encode -> host decode == x (blocks that fit; the others are stored raw, through the
    pool); host encode == reference encode, byte for byte, for every block."""
    enc = encode_blocks_v3(x, b8, b16, g)
    f = enc.fits
    b8, b16 = _bases(b8, x.shape[0], g.head_dim), _bases(b16, x.shape[0], g.head_dim)
    if bool(f.any()):
        same_bits(host_decode(exe, enc.data[f], b8[f], b16[f], g, tmp), x[f])
    pool, entries = pack_blocks(enc, x)
    same_bits(decode_pool_v3(pool, entries, b8, b16, g), x)
    rows, nb = host_encode(exe, x, b8, b16, g, tmp)
    assert torch.equal(nb, enc.nbytes)
    assert torch.equal(rows, enc.data), f"encoder rows differ in {int((rows != enc.data).sum())} bytes"
    return enc


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80])
def test_every_pattern_every_channel(driver, tmp_path, head_dim):
    g = GeometryV3(64, head_dim)
    for i, (x, b8, b16) in enumerate(every_pattern_blocks(g)):
        enc = check_both(driver, x, b8, b16, g, tmp_path)
        shares = torch.bincount(enc.modes.reshape(-1), minlength=3)
        assert bool((shares > 0).all()) if i == 0 else int(shares[2]) > 0.9 * int(shares.sum())


@pytest.mark.parametrize("head_dim", [16, 64, 96, 128, 256])
def test_adversarial_blocks(driver, tmp_path, head_dim):
    g = GeometryV3(64, head_dim)
    x, b8, b16 = adversarial_blocks(g, seed=head_dim)
    enc = check_both(driver, x, b8, b16, g, tmp_path)
    assert not bool(enc.fits.all())  # the all-random blocks do not fit and still decode


@pytest.mark.slow
def test_real_smollm2_kv(driver, tmp_path, smollm2, wikitext_test):
    from gaac_hf.calibration import choose_windows, exponent_histogram
    from gaac_hf.calibration.collect import run_chunks, tokenize

    model, tok = smollm2
    ids = tokenize(tok, wikitext_test, 512)[None, :512]
    g = GeometryV3(64, 64)
    for _, keys, values in run_chunks(model, ids, progress=False):
        for li in (0, 14, 29):
            for x in (keys[li], values[li]):
                b8, b16 = choose_windows(exponent_histogram(x[:, :256]))  # windows from the first half
                blocks = x.reshape(-1, 64, 64)
                b8, b16 = b8.repeat_interleave(8, 0), b16.repeat_interleave(8, 0)
                enc = check_both(driver, blocks, b8, b16, g, tmp_path)
                assert bool(enc.fits.all()) and 0 < int((enc.modes > 0).sum())


MUTATIONS = [
    ("return ((w0 >> 8) & 0x00800080u)", "return ((w0 >> 9) & 0x00800080u)"),  # split pair's bit 0
    ("(((hh >> p) & 0x00010001u) << 10)", "(((hh >> p) & 0x00010001u) << 11)"),  # hi bit position
    ("constexpr uint32_t SIGN_MANT = 0x807F807Fu;", "constexpr uint32_t SIGN_MANT = 0x807F80FFu;"),  # select mask
]


@pytest.mark.parametrize("old,new", MUTATIONS)
def test_mutated_core_fails(tmp_path, old, new):
    """Each single-token change of the core's bit logic is caught by the every-pattern comparison."""
    text = (CORE_DIR / "core.cuh").read_text()
    assert text.count(old) == 1
    exe = build(tmp_path / "mut", {"core.cuh": text.replace(old, new)})
    g = GeometryV3(64, 64)
    x, b8, b16 = next(iter(every_pattern_blocks(g)))
    enc = encode_blocks_v3(x, b8, b16, g)
    with pytest.raises(AssertionError):
        same_bits(host_decode(exe, enc.data, b8, b16, g, tmp_path), x)
