"""v3 CUDA kernels on the GPU against the PyTorch reference (skipped without CUDA + cuda.core).

Encoder: rows byte-identical (and nbytes, fits). Decoder: output poisoned before launch, bit-identical
to the input (compressed and raw blocks through one pool). Decode-and-reduce: XOR fold equal to the
input's. Every BF16 pattern in every channel position, adversarial blocks, KV-like data, at tuned and
generic head_dims.
"""
import pytest
import torch

from gaac_hf.codec.v3 import decode_pool_v3, encode_blocks_v3, pack_blocks
from gaac_hf.format.v3 import GeometryV3
from tests.v3_cases import adversarial_blocks, every_pattern_blocks, same_bits

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cu():
    from gaac_hf.kernels.cuda import codec_v3 as cuda

    reason = cuda.why_unavailable()
    if reason:
        pytest.skip(reason)
    return cuda


def cases(g: GeometryV3):
    yield from every_pattern_blocks(g)
    yield adversarial_blocks(g, seed=g.head_dim)
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(64, g.block_size, g.head_dim, generator=gen) * 0.3).to(torch.bfloat16)
    b8 = torch.full((g.head_dim,), 121, dtype=torch.uint8)
    yield x, b8, b8 - 4


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 16])
def test_gpu_encoder_decoder_reduce(cu, head_dim):
    g = GeometryV3(64, head_dim)
    dev = torch.device("cuda")
    for x, b8, b16 in cases(g):
        x, b8, b16 = x.to(dev), b8.to(dev), b16.to(dev)
        ref = encode_blocks_v3(x, b8, b16, g)
        got = cu.encode_blocks_cuda(x, b8, b16, g)
        assert torch.equal(got.nbytes, ref.nbytes) and torch.equal(got.fits, ref.fits)
        assert torch.equal(got.data, ref.data), f"{int((got.data != ref.data).sum())} encoder bytes differ"
        # bytes of a block are the same without the zero fill
        raw = cu.encode_blocks_cuda(x, b8, b16, g, zero_fill=False)
        keep = torch.arange(g.raw_bytes, device=dev)[None, :] < ref.nbytes[:, None].clamp(max=g.raw_bytes)
        assert torch.equal(raw.data[keep], ref.data[keep])
        pool, entries = pack_blocks(ref, x)
        out = torch.full_like(x, float("nan")).view(torch.int16).fill_(0x7FA5).view(torch.bfloat16)  # poison
        y = cu.decode_pool_cuda(pool, entries, b8, b16, g, out=out)
        torch.cuda.synchronize()
        same_bits(y, x)
        same_bits(decode_pool_v3(pool, entries, b8, b16, g), x)
        fold = cu.decode_reduce_cuda(pool, entries, b8, b16, g)
        assert cu.xor_fold(fold) == cu.xor_fold(x)
        # the pack at device offsets (sync-free stores): the reference pack's bytes, at a 16-byte start,
        # into a poisoned pool whose bytes past the blocks stay untouched
        start = 48
        dev_pool = torch.full((start + pool.numel() + 64,), 0xA5, dtype=torch.uint8, device=dev)
        cu.pack_blocks_cuda(raw.data, raw.nbytes, x, (entries & ~15) + start, dev_pool, g)
        assert torch.equal(dev_pool[start: start + pool.numel()], pool)
        assert bool((dev_pool[:start] == 0xA5).all()) and bool((dev_pool[start + pool.numel():] == 0xA5).all())


def test_gpu_decoder_per_block_bases(cu):
    g = GeometryV3(64, 128)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(40, 64, 128, generator=gen) * torch.logspace(-3, 2, 128)).to(torch.bfloat16).to(dev)
    b8 = torch.randint(100, 130, (40, 128), generator=gen, dtype=torch.uint8).to(dev)
    b16 = (b8.int() - torch.randint(0, 8, (40, 128), generator=gen).to(dev)).to(torch.uint8)
    ref = encode_blocks_v3(x, b8, b16, g)
    got = cu.encode_blocks_cuda(x, b8, b16, g)
    assert torch.equal(got.data, ref.data) and torch.equal(got.nbytes, ref.nbytes)
    pool, entries = pack_blocks(ref, x)
    same_bits(cu.decode_pool_cuda(pool, entries, b8, b16, g), x)
