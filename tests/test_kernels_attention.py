"""Fused GAAC decode attention: vs an fp64 reference, and bit-identical to the BF16 baseline kernel.

CPU runs use the Triton interpreter (conftest.py sets TRITON_INTERPRET=1); the @gpu variants repeat
the checks at real sizes with bf16 tl.dot, where bit identity is the non-trivial claim.
"""
import dataclasses

import pytest
import torch

from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
from gaac_hf.format import BlockGeometry
from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.reference import attention_reference
from gaac_hf.kernels.triton.attention import bf16_decode_attention, gaac_decode_attention
from gaac_hf.kernels.triton.pack import pack_paged_kv, paged_kv

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(B, HKV, GQ, D, T, lens, seed, dev=DEV, force_raw_every=0):
    S = max(lens)
    geom = BlockGeometry(block_size=T, head_dim=D)
    k = synthetic_kv((B, HKV, S, D), "k", seed=seed, device=dev)
    v = synthetic_kv((B, HKV, S, D), "v", seed=seed + 1, device=dev)
    kb8, kb16 = calibrate(k)
    vb8, vb16 = calibrate(v)
    # out-of-window values (exact power-of-two rescales) so compressed blocks hold raw and 4-bit groups
    g = torch.Generator(device=dev).manual_seed(seed + 3)
    for x, f in ((k, 2.0**-30), (v, 2.0**-20)):
        idx = torch.randint(0, x.numel(), (max(1, x.numel() // 400),), generator=g, device=dev)
        x.view(-1)[idx] *= f
    nblk = sum(HKV * (n // T) for n in lens)
    force = None
    if force_raw_every:
        force = torch.arange(nblk, device=dev) % force_raw_every == 1
    pk = pack_paged_kv(k, lens, kb8, kb16, geom, force_raw=force)
    pv = pack_paged_kv(v, lens, vb8, vb16, geom)
    q = (torch.randn(B, HKV * GQ, D, generator=g, device=dev) * 2).to(torch.bfloat16)
    return geom, q, k, v, (kb8, kb16, vb8, vb16), pk, pv


def _gaac(geom, q, bases, pk, pv, kv_start=None, active_blocks=None, **launch):
    out = torch.full_like(q, float("nan"))  # poison: every row must be written
    kv = paged_kv(pk, pv, kv_start=kv_start, active_blocks=active_blocks)
    return gaac_decode_attention(q, kv, out=out, launch=LaunchConfig(**launch))


def _bf16(geom, q, k, v, lens, same_path=False, **launch):
    bk = pack_paged_kv(k, lens, None, None, geom, compress=False)
    bv = pack_paged_kv(v, lens, None, None, geom, compress=False)
    out = torch.full_like(q, float("nan"))
    return bf16_decode_attention(q, paged_kv(bk, bv), out=out, launch=LaunchConfig(**launch), same_path=same_path)


def _with(p, **tensors):
    """``p`` (a frozen PackedTensor) with some of its paged tensors replaced."""
    return dataclasses.replace(p, tensor=dataclasses.replace(p.tensor, **tensors))


def _rel(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


CASES = [
    # B, HKV, GQ, D, T, lens, splits
    (2, 2, 4, 64, 16, [100, 37], 3),  # Qwen-like group of 4, tail + partial
    (3, 3, 3, 64, 16, [64, 5, 80], 2),  # SmolLM2 9/3; exact multiple (empty tail); no complete block
    (1, 1, 4, 256, 16, [70], 4),  # Gemma3 4/1, d=256
    (2, 2, 4, 128, 32, [96, 130], 1),  # d=128, one split (no merge work)
]


@pytest.mark.parametrize("B,HKV,GQ,D,T,lens,splits", CASES)
def test_attention_vs_fp64_and_bit_identical_to_bf16(B, HKV, GQ, D, T, lens, splits):
    geom, q, k, v, bases, pk, pv = _case(B, HKV, GQ, D, T, lens, seed=D + B, force_raw_every=3)
    assert (pk.tensor.table < 0).any() and (pk.tensor.table >= 0).any()  # raw and compressed blocks mixed
    out = _gaac(geom, q, bases, pk, pv, num_splits=splits)
    ref = attention_reference(q, k, v, lens)
    assert not out.isnan().any()
    assert _rel(out, ref) < 1e-2
    base = _bf16(geom, q, k, v, lens, num_splits=splits)
    assert torch.equal(out.view(torch.int16), base.view(torch.int16))
    same = _bf16(geom, q, k, v, lens, num_splits=splits, same_path=True)
    assert torch.equal(out.view(torch.int16), same.view(torch.int16))
    other = _gaac(geom, q, bases, pk, pv, num_splits=splits, tile_tokens=16)  # other sub-tiling
    assert _rel(other, ref) < 1e-2


def test_special_values_in_compressed_blocks_bit_identical_to_bf16():
    """Sparse special bit patterns inside blocks that still fit (their groups go raw): -0, subnormals
    of both signs, the smallest normal, max finite in V, and NaN / Inf in one V row. The GAAC kernel
    must decode them exactly, so its output (NaNs included) has the bits of the BF16 twin's."""
    B, HKV, GQ, D, T, lens = 1, 2, 4, 64, 16, [80]
    geom, q, k, v, bases, _, _ = _case(B, HKV, GQ, D, T, lens, seed=11)
    g = torch.Generator(device=DEV).manual_seed(12)
    k_sp = torch.tensor([0x8000, 0x0001, 0x807F, 0x0080, 0x8001], dtype=torch.int32).to(torch.int16)
    v_sp = torch.tensor([0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF7F], dtype=torch.int32).to(torch.int16)
    for x, sp in ((k, k_sp), (v, v_sp)):
        idx = torch.randint(0, x.numel(), (x.numel() // 300,), generator=g, device=DEV)
        x.view(torch.int16).view(-1)[idx] = sp.to(DEV)[torch.arange(idx.numel(), device=DEV) % len(sp)]
    v.view(torch.int16)[0, 1, 20, :4] = torch.tensor([0x7FC1, 0xFF80, 0x7F80, 0xFFC3], dtype=torch.int32).to(torch.int16).to(DEV)
    pk = pack_paged_kv(k, lens, bases[0], bases[1], geom)
    pv = pack_paged_kv(v, lens, bases[2], bases[3], geom)
    assert pk.fits_fraction == 1.0 and pv.fits_fraction == 1.0  # every block compressed
    out = _gaac(geom, q, bases, pk, pv, num_splits=2)
    base = _bf16(geom, q, k, v, lens, num_splits=2)
    assert torch.equal(out.view(torch.int16), base.view(torch.int16))
    # the NaN / Inf sit in channels 0-3 of a row of kv-head 1: only those output channels of its
    # query heads (4-7) are non-finite
    assert not out[0, 4:, :4].isfinite().any() and out[0, :4].isfinite().all() and out[0, 4:, 4:].isfinite().all()


def test_left_padding_start_offset():
    lens = [90, 75]
    geom, q, k, v, bases, pk, pv = _case(2, 2, 4, 64, 16, lens, seed=5)
    start = [21, 0]
    out = _gaac(geom, q, bases, pk, pv, num_splits=2, kv_start=torch.tensor(start, dtype=torch.int32, device=DEV))
    ref = attention_reference(q, k, v, lens, kv_start=start)
    assert _rel(out, ref) < 1e-2
    assert _rel(out, attention_reference(q, k, v, lens)) > 1e-2  # the mask did something


def test_splits_do_not_change_the_function():
    # 6 blocks + a 4-token tail = 7 split units: 2 splits of 4 (the last short), 5 of 2 (one short, one
    # empty), 11 > units (empty splits must merge as nothing); the interpreter's cost is per block
    lens = [100]
    geom, q, k, v, bases, pk, pv = _case(1, 2, 4, 64, 16, lens, seed=9)
    ref = attention_reference(q, k, v, lens)
    for s in (1, 2, 5, 11):
        assert _rel(_gaac(geom, q, bases, pk, pv, num_splits=s), ref) < 1e-2
    # a table with spare capacity (as the cache preallocates), split grid sized by active_blocks
    pk, pv = (_with(p, table=torch.cat([p.tensor.table, torch.full_like(p.tensor.table, 12345)], -1).contiguous())
              for p in (pk, pv))  # garbage past num_blocks
    assert _rel(_gaac(geom, q, bases, pk, pv, num_splits=3, active_blocks=100 // 16), ref) < 1e-2
    assert _rel(_gaac(geom, q, bases, pk, pv, num_splits=3), ref) < 1e-2


def test_corrupt_slot_is_detected_by_bit_identity():
    """Sanity of the test itself: a one-bit change in a compressed slot must break identity."""
    lens = [64]
    geom, q, k, v, bases, pk, pv = _case(1, 1, 4, 64, 16, lens, seed=13)
    base = _bf16(geom, q, k, v, lens, num_splits=1)
    e = int(pv.tensor.table[0, 0, 0])
    assert e >= 0
    pv.tensor.slots[e, 5] ^= 0x80  # the sign of one value (token 0 = the sink token, channel 5)
    out = _gaac(geom, q, bases, pk, pv, num_splits=1)
    assert not torch.equal(out.view(torch.int16), base.view(torch.int16))


def test_escape_streams_are_read_at_esc_start():
    """The kernel finds each block's stream through esc_start, wherever it lies in the heap: the
    streams re-laid out in reverse order give the same bits; one flipped escape byte breaks them."""
    lens = [130]
    geom, q, k, v, bases, pk, pv = _case(1, 2, 4, 64, 16, lens, seed=17)
    base = _bf16(geom, q, k, v, lens, num_splits=2)
    assert torch.equal(_gaac(geom, q, bases, pk, pv, num_splits=2).view(torch.int16), base.view(torch.int16))
    moved = []
    for p in (pk, pv):
        start, heap = p.tensor.esc_start, p.tensor.heap[: p.escape_bytes]
        lens_b = torch.diff(torch.cat([start, start.new_tensor([heap.numel()])]))
        assert (lens_b > 0).all()  # every block of this data has 4-bit or raw groups
        parts = [heap[int(a): int(a) + int(n)] for a, n in zip(start, lens_b)][::-1]
        new_heap = torch.cat([torch.full((7,), 0xEE, dtype=torch.uint8, device=heap.device), *parts])
        rev = lens_b.flip(0)
        new_start = (7 + torch.cumsum(rev, 0) - rev).flip(0)  # block i's stream, now in reverse order
        moved.append(_with(p, heap=new_heap.contiguous(), esc_start=new_start.contiguous()))
    pk, pv = moved
    assert torch.equal(_gaac(geom, q, bases, pk, pv, num_splits=2).view(torch.int16), base.view(torch.int16))
    pv.tensor.heap[int(pv.tensor.esc_start[0])] ^= 0xFF  # exponent bit 3 of the first escaped group of V block 0
    assert not torch.equal(_gaac(geom, q, bases, pk, pv, num_splits=2).view(torch.int16), base.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("HKV,GQ,D", [(8, 4, 128), (3, 3, 64), (1, 4, 256)])
def test_attention_gpu_real_size(HKV, GQ, D):
    lens = [8192 + 37, 4096, 3000 + 64 * 7]
    geom, q, k, v, bases, pk, pv = _case(3, HKV, GQ, D, 64, lens, seed=D, force_raw_every=5)
    out = _gaac(geom, q, bases, pk, pv)
    ref = attention_reference(q, k, v, lens)
    assert _rel(out, ref) < 1e-2
    same = _bf16(geom, q, k, v, lens, same_path=True)
    assert torch.equal(out.view(torch.int16), same.view(torch.int16))
    base = _bf16(geom, q, k, v, lens)
    assert torch.equal(out.view(torch.int16), base.view(torch.int16))
