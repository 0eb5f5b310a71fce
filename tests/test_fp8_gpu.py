"""FP8-tile CUDA kernels (kernels/cuda/codec_fp8.py: gaac_v3/kernels.cu built with -DGAAC_FP8=1 | 2) on the
GPU against the PyTorch reference gaac_hf/codec/fp8.py, run on the CPU (marker gpu; skipped without CUDA
+ cuda.core). E4M3 and E5M2.

Encoder: rows poisoned before the launch, bytes up to each block's length equal the reference's and
nothing after them written; the launcher's zero-filled rows equal the reference rows in full; lengths and
``fits`` equal. Decoder: output poisoned before the launch, codes equal the input's (compressed and raw
blocks through one pool). Pack at device offsets: the reference pool's bytes, nothing else of a poisoned
pool touched. Inputs: all 256 codes in every channel position (per-block and shared bases), NaN / Inf /
zero / subnormal codes, adversarial blocks, many KV-like blocks (a grid-stride loop over more blocks
than a wave), real SmolLM2 K/V converted to FP8 as the FP8 caches convert it.
tests/test_fp8_kernels_host.py runs the same kernel source on the CPU.
"""
import pytest
import torch

from gaac_hf.codec.fp8 import decode_pool_fp8, encode_blocks_fp8, quantize_fp8, torch_dtype
from gaac_hf.codec.v3 import pack_blocks
from gaac_hf.format.fp8 import GeometryFP8
from tests.fp8_cases import (
    DTYPES, adversarial_blocks, every_code_blocks, real_fp8_blocks, same_codes, special_blocks,
)

pytestmark = pytest.mark.gpu
POISON = 0xA5
DEV = torch.device("cuda")


def _sync() -> None:
    torch.cuda.synchronize()


@pytest.fixture(scope="module")
def cu():
    from gaac_hf.kernels.cuda import codec_fp8

    reason = codec_fp8.why_unavailable()
    if reason:
        pytest.skip(reason)
    return codec_fp8


def encode_poisoned(cu, x, bn, bw, g):
    """The encoder kernel into rows and lengths poisoned before the launch (the launcher's own rows start zeroed)."""
    n = x.shape[0]
    rows = torch.full((n, g.raw_bytes), POISON, dtype=torch.uint8, device=x.device)
    nbytes = torch.full((n,), -1, dtype=torch.int32, device=x.device)
    b8, stride = cu._rows(bn, g)
    b16, _ = cu._rows(bw, g)
    cu._launch(g, x.device, "gaac_v3_encode", n, 32 * g.segments, x.contiguous(), b8, b16, stride, rows, nbytes)
    return rows, nbytes


def check_on_gpu(cu, x, bn, bw, g, grid=None):
    """Every comparison of one batch: x uint8 codes [N, T, D], bases [D] or [N, D] (all on the CPU); grid:
    the decoder's CTAs (None: the launcher's choice)."""
    dev = DEV
    ref = encode_blocks_fp8(x, bn, bw, g)  # the spec, on the CPU
    xd, bnd, bwd = x.to(dev), bn.to(dev), bw.to(dev)
    got = cu.encode_blocks_fp8_cuda(xd, bnd, bwd, g)
    assert torch.equal(got.nbytes.cpu(), ref.nbytes) and torch.equal(got.fits.cpu(), ref.fits)
    assert torch.equal(got.data.cpu(), ref.data), f"{int((got.data.cpu() != ref.data).sum())} encoder bytes differ"
    rows, nbytes = encode_poisoned(cu, xd, bnd, bwd, g)
    rows, nbytes = rows.cpu(), nbytes.cpu()
    keep = torch.arange(g.raw_bytes)[None, :] < ref.nbytes[:, None].clamp(max=g.raw_bytes)
    assert torch.equal(nbytes, ref.nbytes)
    assert torch.equal(rows[keep], ref.data[keep]), f"{int((rows[keep] != ref.data[keep]).sum())} encoder bytes differ"
    assert bool((rows[~keep] == POISON).all()), "the encoder wrote past a block"
    # the float8 tensor is accepted as its codes
    again = cu.encode_blocks_fp8_cuda(xd.view(torch_dtype(g)), bnd, bwd, g)
    assert torch.equal(again.data, got.data)

    pool, entries = pack_blocks(ref, x)
    out = torch.full(x.shape, POISON, dtype=torch.uint8, device=dev)
    y = cu.decode_pool_fp8_cuda(pool.to(dev), entries.to(dev), bnd, bwd, g, out=out, grid=grid)
    _sync()
    assert y.data_ptr() == out.data_ptr()
    same_codes(y.cpu(), x)
    same_codes(decode_pool_fp8(pool, entries, bn, bw, g), x)  # the reference agrees with itself
    if bool(ref.fits.any()):  # encoder rows read directly as compressed blocks
        f = ref.fits
        same_codes(cu.decode_blocks_fp8_cuda(got.data[f.to(dev)], bnd if bn.dim() == 1 else bnd[f.to(dev)],
                                             bwd if bw.dim() == 1 else bwd[f.to(dev)], g).cpu(), x[f])

    # the pack at device offsets (sync-free stores), from the encoder's unfilled rows
    raw = cu.encode_blocks_fp8_cuda(xd, bnd, bwd, g, zero_fill=False)
    start = 48
    dev_pool = torch.full((start + pool.numel() + 64,), POISON, dtype=torch.uint8, device=dev)
    cu.pack_blocks_fp8_cuda(raw.data, raw.nbytes, xd, (entries.to(dev) & ~15) + start, dev_pool, g)
    dev_pool = dev_pool.cpu()
    assert torch.equal(dev_pool[start: start + pool.numel()], pool)
    assert bool((dev_pool[:start] == POISON).all()) and bool((dev_pool[start + pool.numel():] == POISON).all())
    return ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 16])
def test_gpu_every_code_every_channel(cu, dtype, head_dim):
    g = GeometryFP8(64, head_dim, dtype)
    for i, (x, bn, bw) in enumerate(every_code_blocks(g)):
        ref = check_on_gpu(cu, x, bn, bw, g)
        if i == 0:  # every mode the format has occurs
            shares = torch.bincount(ref.modes.reshape(-1), minlength=3)
            assert int(shares[0]) > 0 and int(shares[1]) > 0 and (int(shares[2]) > 0) == g.has_raw, shares


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,head_dim", [(64, 64), (64, 128), (64, 256), (16, 80), (32, 96)])
def test_gpu_special_and_adversarial_blocks(cu, dtype, block_size, head_dim):
    """NaN / Inf / zero / subnormal / max codes (dense: stored raw; sparse: compressed) and the adversarial set."""
    g = GeometryFP8(block_size, head_dim, dtype)
    xs, bns, bws = special_blocks(g)
    xa, bna, bwa = adversarial_blocks(g, seed=head_dim)
    x = torch.cat([xs, xa])
    bn = torch.cat([bns.expand(2, head_dim), bna])
    bw = torch.cat([bws.expand(2, head_dim), bwa])
    ref = check_on_gpu(cu, x, bn, bw, g)
    assert not bool(ref.fits.all()) and bool(ref.fits[1])
    assert (int((ref.modes == 2).sum()) > 0) == g.has_raw


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_many_kv_like_blocks(cu, dtype):
    """600 KV-like blocks with a few outliers; the decoder on 7 CTAs (56 warps), so its grid-stride loop
    wraps, and on the launcher's grid."""
    g = GeometryFP8(64, 128, dtype)
    gen = torch.Generator().manual_seed(11)
    v = torch.randn(600, 64, 128, generator=gen) * torch.logspace(-2, 1, 128)
    v.view(-1)[torch.randint(0, v.numel(), (400,), generator=gen)] *= 1e3
    from gaac_hf.codec.fp8 import choose_windows_fp8, exponent_histogram_fp8, fp8_scale

    x = quantize_fp8(v, fp8_scale(v[:100], dtype), dtype, saturate=True)
    bn, bw = choose_windows_fp8(exponent_histogram_fp8(x[:100].reshape(1, -1, 128), g)[0], g)
    ref = check_on_gpu(cu, x, bn, bw, g, grid=7)
    assert bool(ref.fits.all()) and int((ref.modes > 0).sum()) > 0
    pool, entries = pack_blocks(ref, x)
    same_codes(cu.decode_pool_fp8_cuda(pool.to(DEV), entries.to(DEV), bn.to(DEV), bw.to(DEV), g).cpu(), x)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_real_smollm2_kv_in_fp8(cu, smollm2, wikitext_test, dtype):
    """Post-RoPE K/V of SmolLM2-135M (every layer, K and V, 1,024 tokens), converted as the FP8 caches do (amax
    scale of the first half, saturating), windows of each kv-head from the first half: per-block bases."""
    g = GeometryFP8(64, 64, dtype)
    ref = check_on_gpu(cu, *real_fp8_blocks(smollm2, wikitext_test, dtype, tokens=1024, layers=None), g)
    assert int((ref.modes > 0).sum()) > 0
