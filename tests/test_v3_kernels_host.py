"""The CUDA kernels of kernels/cuda/gaac_v3/kernels.cu executed on the CPU (host_cuda_shim.h: one
std::thread per CUDA thread, warp primitives as barriers) against the PyTorch reference: encoder
bytes identical on poisoned rows (and nothing written past a block), decoder on a poisoned output bit-identical (compressed and raw blocks in one pool, a
grid smaller than the work so the grid-stride loop wraps), decode-and-reduce fold equal. This runs
the real kernel source (lane roles, addresses, the windowed fix-up, the encoder's ranks) without a GPU;
tests/test_v3_gpu.py repeats it on the device.
"""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gaac_hf.v3.codec import encode_blocks_v3, pack_blocks
from gaac_hf.v3.cuda import pair_tables, xor_fold
from gaac_hf.v3.format import GeometryV3
from tests.v3_cases import adversarial_blocks, every_pattern_blocks, same_bits

SRC = Path(__file__).resolve().parents[1] / "kernels" / "cuda" / "gaac_v3"
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    cache = {}

    def get(head_dim: int) -> Path:
        if head_dim not in cache:
            exe = tmp_path_factory.mktemp(f"hk{head_dim}") / "host_kernels"
            subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-DBLOCK_T=64", f"-DHEAD_DIM={head_dim}",
                            str(SRC / "host_kernels.cpp"), "-o", str(exe)], check=True, capture_output=True)
            cache[head_dim] = exe
        return cache[head_dim]

    return get


def run_kernels(exe: Path, tmp: Path, x, b8, b16, g: GeometryV3, grid: int = 3):
    n, d = x.shape[0], g.head_dim
    b8, b16 = b8.expand(n, d).contiguous(), b16.expand(n, d).contiguous()
    (tmp / "x.bin").write_bytes(x.contiguous().view(torch.int16).numpy().tobytes())
    (tmp / "b8.bin").write_bytes(b8.numpy().tobytes())
    (tmp / "b16.bin").write_bytes(b16.numpy().tobytes())
    f = lambda name: str(tmp / name)  # noqa: E731
    subprocess.run([str(exe), "encode", str(n), f("x.bin"), f("b8.bin"), f("b16.bin"), f("rows.bin"), f("nb.bin")], check=True)
    rows = torch.frombuffer(bytearray((tmp / "rows.bin").read_bytes()), dtype=torch.uint8).reshape(n, g.raw_bytes)
    nb = torch.frombuffer(bytearray((tmp / "nb.bin").read_bytes()), dtype=torch.int32)
    ref = encode_blocks_v3(x, b8, b16, g)
    pool, entries = pack_blocks(ref, x)
    b8p, dbp, _ = pair_tables(b8, b16, g)
    (tmp / "pool.bin").write_bytes(pool.numpy().tobytes())
    (tmp / "ent.bin").write_bytes(entries.numpy().tobytes())
    (tmp / "b8p.bin").write_bytes(b8p.numpy().tobytes())
    (tmp / "dbp.bin").write_bytes(dbp.numpy().tobytes())
    args = [str(n), str(grid), f("pool.bin"), f("ent.bin"), f("b8p.bin"), f("dbp.bin")]
    subprocess.run([str(exe), "decode", *args, f("out.bin")], check=True)
    subprocess.run([str(exe), "reduce", *args, f("fold.bin")], check=True)
    out = torch.frombuffer(bytearray((tmp / "out.bin").read_bytes()), dtype=torch.int16).reshape(x.shape).view(torch.bfloat16)
    fold = torch.frombuffer(bytearray((tmp / "fold.bin").read_bytes()), dtype=torch.int32)
    return ref, rows, nb, out, fold


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 112])
def test_kernels_on_host_match_reference(build, tmp_path, head_dim):
    g = GeometryV3(64, head_dim)
    exe = build(head_dim)
    x0, b80, b160 = next(iter(every_pattern_blocks(g)))
    xa, b8a, b16a = adversarial_blocks(g, seed=head_dim)
    k = 12 if head_dim <= 128 else 6  # a slice of the every-pattern blocks (all modes occur) + the adversarial set
    x = torch.cat([x0[:k], xa])
    b8 = torch.cat([b80[:k], b8a])
    b16 = torch.cat([b160[:k], b16a])
    ref, rows, nb, out, fold = run_kernels(exe, tmp_path, x, b8, b16, g)
    assert torch.equal(nb, ref.nbytes)
    keep = torch.arange(g.raw_bytes)[None, :] < ref.nbytes[:, None].clamp(max=g.raw_bytes)  # rows start poisoned
    assert torch.equal(rows[keep], ref.data[keep]), f"{int((rows[keep] != ref.data[keep]).sum())} encoder bytes differ"
    assert bool((rows[~keep] == 0xA5).all())  # nothing written past a block
    assert not bool(ref.fits.all()) and bool(ref.fits.any())
    same_bits(out, x)
    assert xor_fold(fold) == xor_fold(x)
