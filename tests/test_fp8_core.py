"""The FP8-tile C++ core (kernels/cuda/gaac_v3/core_fp8.cuh, on core.cuh), compiled by g++, against the
PyTorch reference (gaac_hf/codec/fp8.py): decoder code for code, encoder byte for byte, E4M3 and E5M2.

Inputs: all 256 codes in every channel position (every mode, each format's NaN / Inf codes among them),
the special-code and adversarial blocks of tests/fp8_cases.py, real SmolLM2 K/V converted as an FP8
cache converts it. Mutation checks: one shift / base of the core changed must make a comparison fail. Real
K/V (the model forward) and the mutation checks are marker ``full`` (CI seconds, issue 12).
"""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gaac_hf.codec.fp8 import decode_pool_fp8, encode_blocks_fp8
from gaac_hf.codec.v3 import pack_blocks
from gaac_hf.format.fp8 import GeometryFP8
from tests.fp8_cases import (
    DTYPES, adversarial_blocks, every_code_blocks, real_fp8_blocks, same_codes, special_blocks,
)
from tests.host_core import CORE_DIR, build

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("fp8core"))


def _bases(b, n, d):
    return (b if b.dim() == 2 else b.unsqueeze(0)).expand(n, d).contiguous()


def _run(exe: Path, mode: str, g: GeometryFP8, tmp: Path, *args, files) -> None:
    subprocess.run([str(exe), mode, str(g.man_bits), str(g.block_size), str(g.head_dim), *map(str, args),
                    *(str(tmp / f) for f in files)], check=True)


def host_decode(exe, data, bn, bw, g, tmp) -> torch.Tensor:
    n = data.shape[0]
    for name, t in (("blk.bin", data), ("bn.bin", _bases(bn, n, g.head_dim)), ("bw.bin", _bases(bw, n, g.head_dim))):
        (tmp / name).write_bytes(t.contiguous().numpy().tobytes())
    _run(exe, "decode_fp8", g, tmp, n, data.shape[1], files=("blk.bin", "bn.bin", "bw.bin", "out.bin"))
    return torch.frombuffer(bytearray((tmp / "out.bin").read_bytes()), dtype=torch.uint8).reshape(n, g.block_size, g.head_dim)


def host_encode(exe, x, bn, bw, g, tmp):
    n = x.shape[0]
    for name, t in (("x.bin", x), ("bn.bin", _bases(bn, n, g.head_dim)), ("bw.bin", _bases(bw, n, g.head_dim))):
        (tmp / name).write_bytes(t.contiguous().numpy().tobytes())
    _run(exe, "encode_fp8", g, tmp, n, files=("x.bin", "bn.bin", "bw.bin", "rows.bin", "nb.bin"))
    rows = torch.frombuffer(bytearray((tmp / "rows.bin").read_bytes()), dtype=torch.uint8).reshape(n, g.raw_bytes)
    return rows, torch.frombuffer(bytearray((tmp / "nb.bin").read_bytes()), dtype=torch.int32)


def check_both(exe, x, bn, bw, g, tmp):
    """Reference encode -> host decode == x (blocks that fit; the others go through the reference pool);
    host encode == reference encode, byte for byte (rows and lengths), for every block."""
    enc = encode_blocks_fp8(x, bn, bw, g)
    bn, bw = _bases(bn, x.shape[0], g.head_dim), _bases(bw, x.shape[0], g.head_dim)
    f = enc.fits
    if bool(f.any()):
        same_codes(host_decode(exe, enc.data[f], bn[f], bw[f], g, tmp), x[f])
    pool, entries = pack_blocks(enc, x)
    same_codes(decode_pool_fp8(pool, entries, bn, bw, g), x)
    rows, nb = host_encode(exe, x, bn, bw, g, tmp)
    assert torch.equal(nb, enc.nbytes)
    assert torch.equal(rows, enc.data), f"encoder rows differ in {int((rows != enc.data).sum())} bytes"
    return enc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
def test_every_code_every_channel(driver, tmp_path, dtype, head_dim):
    g = GeometryFP8(64, head_dim, dtype)
    for i, (x, bn, bw) in enumerate(every_code_blocks(g)):
        enc = check_both(driver, x, bn, bw, g, tmp_path)
        shares = torch.bincount(enc.modes.reshape(-1), minlength=3)
        if i == 0:  # every mode the format has occurs
            assert int(shares[0]) > 0 and int(shares[1]) > 0 and (int(shares[2]) > 0) == g.has_raw, shares


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 96, 256])
def test_special_and_adversarial_blocks(driver, tmp_path, dtype, head_dim):
    g = GeometryFP8(64, head_dim, dtype)
    xs, bns, bws = special_blocks(g)
    xa, bna, bwa = adversarial_blocks(g, seed=head_dim)
    x = torch.cat([xs, xa])
    enc = check_both(driver, x, torch.cat([_bases(bns, 2, head_dim), bna]), torch.cat([_bases(bws, 2, head_dim), bwa]),
                     g, tmp_path)
    assert not bool(enc.fits.all()) and bool(enc.fits[1])  # random bytes stored raw; the sparse specials compressed
    assert (int((enc.modes == 2).sum()) > 0) == g.has_raw


@pytest.mark.slow
@pytest.mark.full  # the model forward is most of its ~9 s: out of the default run (issue 12); test_fp8_gpu.py has it too
@pytest.mark.parametrize("dtype", DTYPES)
def test_real_smollm2_kv_in_fp8(driver, tmp_path, smollm2, wikitext_test, dtype):
    """Post-RoPE K/V of SmolLM2-135M (layers 0, 14, 29; 256 tokens, one forward for both dtypes), converted as
    the FP8 caches do (amax scale of the first half, saturating), windows from the first half."""
    x, bn, bw = real_fp8_blocks(smollm2, wikitext_test, dtype)
    enc = check_both(driver, x, bn, bw, GeometryFP8(64, 64, dtype), tmp_path)
    assert bool(enc.fits.all()) and int((enc.modes > 0).sum()) > 0


# (text, replacement, dtype whose comparison must fail): one change each to the record, the windows, the raw byte
MUTATIONS = [
    ("const uint32_t y = R >> (6 * p);", "const uint32_t y = R >> (6 * p + 1);", "fp8_e5m2"),  # sm record field shift
    ("fix_group(o, dbp, entry, spread_raw_byte(raw_byte));", "fix_group(o, b8p, entry, spread_raw_byte(raw_byte));",
     "fp8_e4m3"),  # wide groups decoded against the wrong window base
    ("  return (x | (x << 3)) & 0x11111111u;", "  return (x | (x << 4)) & 0x11111111u;", "fp8_e5m2"),  # raw byte bits
]


@pytest.mark.full  # one g++ build each (~1 s): run with -m "full or not full" after changing core_fp8.cuh (issue 12)
@pytest.mark.parametrize("old,new,dtype", MUTATIONS)
def test_mutated_core_fails(tmp_path, old, new, dtype):
    text = (CORE_DIR / "core_fp8.cuh").read_text()
    assert text.count(old) == 1
    exe = build(tmp_path / "mut", {"core_fp8.cuh": text.replace(old, new)})
    g = GeometryFP8(64, 64, dtype)
    x, bn, bw = next(iter(every_code_blocks(g)))
    with pytest.raises(AssertionError):
        check_both(exe, x, bn, bw, g, tmp_path)
