"""Triton encoder/decoder vs the reference codec: byte-identical slots, bit-identical decode.

Runs on CPU through TRITON_INTERPRET=1 (set in conftest.py); the @gpu variants run real sizes on CUDA.
"""
import pytest
import torch

from gaac_hf.codec import decode_blocks, encode_blocks
from gaac_hf.format import BlockGeometry
from gaac_hf.kernels.decode import decode_blocks_triton
from gaac_hf.kernels.encode import encode_blocks_triton
from gaac_hf.kernels.synth import calibrate, synthetic_kv

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SPECIALS = [0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0x0080, 0x3F80]


def _bits(x):
    return x.view(torch.int16)


def _adversarial(n, t, d, seed):
    """KV-like blocks plus: special bit patterns, out-of-window values, fully random bit patterns."""
    g = torch.Generator().manual_seed(seed)
    x = synthetic_kv((1, 1, n * t, d), "k", seed=seed).reshape(n, t, d)
    b8, b16 = calibrate(x.reshape(1, 1, n * t, d))
    b = _bits(x)
    sp = torch.tensor(SPECIALS, dtype=torch.int32).to(torch.int16)
    # block 0: specials sprinkled everywhere; block 1: uniformly random bits (mostly raw groups)
    idx = torch.randint(0, t * d, (t * d // 4,), generator=g)
    b[0].view(-1)[idx] = sp[torch.randint(0, len(sp), idx.shape, generator=g)]
    if n > 1:
        b[1] = torch.randint(-(2**15), 2**15, (t, d), generator=g, dtype=torch.int32).to(torch.int16)
    if n > 2:  # block 2: one value per group pushed just out of the 8-window (-> 4-bit groups)
        e = (b8[0].int() + 8).clamp(max=255)
        b[2, :, ::8] = ((e[::8] << 7) | 0x15).to(torch.int16)
    return x, b8[0], b16[0]


GEOMS = [
    BlockGeometry(block_size=16, head_dim=64, escape_capacity=64),
    BlockGeometry(block_size=32, head_dim=128, escape_capacity=256),
    BlockGeometry(block_size=16, head_dim=256, escape_capacity=128),
    BlockGeometry(block_size=64, head_dim=128, escape_capacity=0),
]


@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: f"T{g.block_size}-D{g.head_dim}-cap{g.escape_capacity}")
@pytest.mark.parametrize("per_block_bases", [False, True])
@pytest.mark.parametrize("fast", [False, True], ids=["block", "groups"])
def test_encode_matches_reference(geom, per_block_bases, fast):
    n = 5
    x, b8, b16 = _adversarial(n, geom.block_size, geom.head_dim, seed=geom.head_dim + per_block_bases)
    if per_block_bases:
        g = torch.Generator().manual_seed(3)
        b8 = (b8.int() + torch.randint(-2, 3, (n, geom.head_dim), generator=g)).clamp(0, 248).to(torch.uint8)
        b16 = (b16.int() + torch.randint(-2, 3, (n, geom.head_dim), generator=g)).clamp(0, 240).to(torch.uint8)
    ref = encode_blocks(x, b8, b16, geom)
    poison = torch.full((n, geom.slot_bytes), 0xA5, dtype=torch.uint8)  # every byte must be written
    got = encode_blocks_triton(x, b8, b16, geom, slots=poison, with_tags=True, fast=fast, tile_tokens=8)
    assert torch.equal(got.tags, ref.tags)
    assert torch.equal(got.escape_len, ref.escape_len)
    assert torch.equal(got.fits, ref.fits)
    assert torch.equal(got.slots, ref.slots)
    assert not got.fits.all()  # the random-bits block always overflows
    if not per_block_bases and geom.escape_capacity:
        assert got.fits.any()  # KV-like blocks fit: both kinds exercised


@pytest.mark.parametrize("geom", GEOMS[:3], ids=lambda g: f"T{g.block_size}-D{g.head_dim}")
def test_decode_matches_reference_and_roundtrips(geom):
    n = 6
    x, b8, b16 = _adversarial(n, geom.block_size, geom.head_dim, seed=7 + geom.head_dim)
    enc = encode_blocks(x, b8, b16, geom)
    out = torch.full_like(x, float("nan"))
    got = decode_blocks_triton(enc.slots, b8, b16, geom, out=out)
    ref = decode_blocks(enc.slots, b8, b16, geom, validate=False)
    assert torch.equal(_bits(got), _bits(ref))
    assert enc.fits.sum() >= 2
    # attention's fast decoder: same bits on every slot that fits (it assumes valid slots)
    fast = decode_blocks_triton(enc.slots[enc.fits], b8, b16, geom, fast=True, tile_tokens=8)
    assert torch.equal(_bits(fast), _bits(x)[enc.fits])
    assert torch.equal(_bits(got)[enc.fits], _bits(x)[enc.fits])  # lossless where it fits


def test_decode_garbage_slots_matches_reference():
    """Random bytes (reserved tags, escape overrun) decode exactly as the reference with validate=False."""
    geom = BlockGeometry(block_size=16, head_dim=128, escape_capacity=64)
    g = torch.Generator().manual_seed(11)
    slots = torch.randint(0, 256, (4, geom.slot_bytes), generator=g, dtype=torch.int32).to(torch.uint8)
    b8 = torch.randint(0, 256, (4, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    b16 = torch.randint(0, 256, (4, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    got = decode_blocks_triton(slots, b8, b16, geom)
    ref = decode_blocks(slots, b8, b16, geom, validate=False)
    assert torch.equal(_bits(got), _bits(ref))


def test_token_axis_is_reference_only():
    geom = BlockGeometry(block_size=16, head_dim=64, group_axis="token")
    x = synthetic_kv((1, 1, 16, 64)).reshape(1, 16, 64)
    b = torch.full((64,), 120, dtype=torch.uint8)
    with pytest.raises(NotImplementedError):
        encode_blocks_triton(x, b, b, geom)
    with pytest.raises(NotImplementedError):
        decode_blocks_triton(torch.zeros(1, geom.slot_bytes, dtype=torch.uint8), b, b, geom)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_codec_gpu_real_size(d):
    geom = BlockGeometry(block_size=64, head_dim=d, escape_capacity=256 * d // 128)
    n = 4096
    x, b8, b16 = _adversarial(n, 64, d, seed=d)
    x, b8, b16 = x.to(DEV), b8.to(DEV), b16.to(DEV)
    ref = encode_blocks(x, b8, b16, geom)
    got = encode_blocks_triton(x, b8, b16, geom, slots=torch.full((n, geom.slot_bytes), 0xA5, dtype=torch.uint8, device=DEV))
    assert torch.equal(got.slots, ref.slots) and torch.equal(got.escape_len, ref.escape_len)
    dec = decode_blocks_triton(ref.slots, b8, b16, geom)
    assert torch.equal(_bits(dec), _bits(decode_blocks(ref.slots, b8, b16, geom, validate=False)))
