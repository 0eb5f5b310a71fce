"""GPU tests of the CUDA C++ split-KV decode attention (``gaac_hf.kernels.cuda.attention``).

Against an fp64 reference within bf16 tolerance, outputs poisoned with NaN before every launch, on
random and adversarial K/V, every grid shape the kernel is compiled for (head_dim multiples of 16,
GQA groups 1..16, block sizes 16..128), varlen and left-padded batches, forced split counts, garbage
(NaN/Inf) in every position the kernel must not read, CUDA-graph capture and no host sync.
"""
from __future__ import annotations


import pytest
import torch

from tests.cuda_skip import skip_unless_cuda_kernels

pytestmark = pytest.mark.gpu

skip_unless_cuda_kernels()

from gaac_hf.kernels.reference import attention_reference  # noqa: E402
from gaac_hf.kernels import LaunchConfig, PagedKV, PagedTensor
from gaac_hf.kernels.cuda.attention import bf16_decode_attention, bf16_decode_attention_tensors, pack_paged_bf16  # noqa: E402

DEV = torch.device("cuda")


def _rel_err(out, ref):
    return float((out.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30))


def _run(q, pk, pv, kv_start=None, config=None, active_blocks=None):
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                               pk["num_blocks"], pk["tail_len"], kv_start=kv_start, config=config,
                               active_blocks=active_blocks, out=out)
    torch.cuda.synchronize()
    return out


def _poison_unused(p, seq_lens, T):
    """NaN/Inf in the tail rows past each sequence's end: a kernel that reads them fails."""
    for b, s in enumerate(seq_lens):
        r = s - (s // T) * T
        p["tail"][b, :, r:] = float("nan")
        if r + 1 < T:
            p["tail"][b, :, r + 1:: 2] = float("inf")


CASES = [  # (B, Hq, Hkv, D, T, seq_lens)
    (1, 32, 8, 128, 64, [4096 + 37]),
    (3, 32, 8, 128, 64, [1, 700, 2048]),
    (2, 9, 3, 64, 64, [5000, 63]),
    (1, 4, 1, 256, 64, [3000]),
    (2, 8, 8, 128, 64, [1000, 129]),      # group 1
    (1, 32, 2, 128, 64, [1500]),          # group 16 (two n-tiles)
    (2, 20, 2, 80, 64, [900, 333]),       # head_dim 80 (Phi-2), group 10
    (1, 12, 4, 96, 32, [777]),            # head_dim 96, block 32 (stage spans two blocks)
    (1, 16, 4, 112, 128, [1100]),         # head_dim 112, block 128 (block spans two stages)
    (2, 8, 2, 16, 16, [50, 17]),          # smallest head_dim and block
    (1, 32, 8, 128, 64, [0]),             # empty sequence: zeros
]


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", CASES)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("loader", ["cp.async", "bulk"])
def test_matches_fp64_reference(B, HQ, HKV, D, T, lens, splits, loader):
    g = torch.Generator(device="cpu").manual_seed(hash((B, HQ, HKV, D, T, tuple(lens))) % 2**31)
    S = max(max(lens), 1)
    k = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(B, HQ, D, generator=g).to(torch.bfloat16).to(DEV)
    pk, pv = pack_paged_bf16(k, lens, T, generator=g), pack_paged_bf16(v, lens, T, generator=g)
    _poison_unused(pk, lens, T)
    _poison_unused(pv, lens, T)
    out = _run(q, pk, pv, config=LaunchConfig(num_splits=splits, loader=loader))
    assert not torch.isnan(out).any(), "an output element was not written (or NaN leaked in)"
    ref = attention_reference(q, k, v, lens)
    if max(lens) == 0:
        assert torch.equal(out, torch.zeros_like(out))
        return
    assert _rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("loader", ["cp.async", "bulk"])
def test_left_padding(D, loader):
    g = torch.Generator(device="cpu").manual_seed(D)
    B, HQ, HKV, T = 3, 8, 2, 64
    lens, starts = [900, 1500, 64], [0, 700, 63]
    S = max(lens)
    k = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    for b, s0 in enumerate(starts):  # padding positions hold garbage the mask must keep out
        k[b, :, :s0] = float("nan")
        v[b, :, :s0] = float("inf")
    q = torch.randn(B, HQ, D, generator=g).to(torch.bfloat16).to(DEV)
    pk, pv = pack_paged_bf16(k, lens, T, generator=g), pack_paged_bf16(v, lens, T, generator=g)
    ks = torch.tensor(starts, dtype=torch.int32, device=DEV)
    for splits in (None, 1, 4):
        out = _run(q, pk, pv, kv_start=ks, config=LaunchConfig(num_splits=splits, loader=loader))
        ref = attention_reference(q, k, v, lens, kv_start=starts)
        assert not torch.isnan(out).any()
        assert _rel_err(out, ref) < 1e-2


def test_adversarial_values():
    """Large scores (softmax far from uniform), one dominant token, exact zeros, subnormals."""
    g = torch.Generator(device="cpu").manual_seed(7)
    B, HQ, HKV, D, T = 2, 32, 8, 128, 64
    lens = [3000, 2100]
    S = max(lens)
    k = (torch.randn(B, HKV, S, D, generator=g) * 8).to(torch.bfloat16)
    v = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16)
    k[:, :, 1234] *= 30  # a sink token
    v[:, :, ::7] = 0
    v[:, :, 5, :16] = torch.tensor(1e-39).to(torch.bfloat16)  # subnormal values
    q = torch.randn(B, HQ, D, generator=g).to(torch.bfloat16)
    k, v, q = k.to(DEV), v.to(DEV), q.to(DEV)
    pk, pv = pack_paged_bf16(k, lens, T, generator=g), pack_paged_bf16(v, lens, T, generator=g)
    out = _run(q, pk, pv)
    ref = attention_reference(q, k, v, lens)
    assert not torch.isnan(out).any()
    assert _rel_err(out, ref) < 1e-2


def test_graph_capture_and_no_host_sync():
    """Captured once, replayed after the lengths changed on the device: same result as eager."""
    g = torch.Generator(device="cpu").manual_seed(3)
    B, HQ, HKV, D, T = 2, 32, 8, 128, 64
    lens = [4000, 2500]
    S = 4096
    k = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(B, HQ, D, generator=g).to(torch.bfloat16).to(DEV)
    pk, pv = pack_paged_bf16(k, [S, S], T, generator=g), pack_paged_bf16(v, [S, S], T, generator=g)
    nb = torch.tensor([l // T for l in lens], dtype=torch.int32, device=DEV)
    tl = torch.tensor([l % T for l in lens], dtype=torch.int32, device=DEV)
    # the tail of a full-S pack is empty; move each sequence's last partial block into its tail
    for b, l in enumerate(lens):
        blk = l // T
        for p, src in ((pk, k), (pv, v)):
            p["tail"][b] = float("nan")
            p["tail"][b, :, : l % T] = src[b, :, blk * T: l]
    out = torch.full_like(q, float("nan"))

    def call():
        bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                   nb, tl, out=out)

    call()  # compile + warm up outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    ref = attention_reference(q, k, v, lens)
    assert _rel_err(out, ref) < 1e-2
    # shorter sequences, same graph
    lens2 = [1000, 64]
    for b, l in enumerate(lens2):
        for p, src in ((pk, k), (pv, v)):
            p["tail"][b] = float("nan")
            p["tail"][b, :, : l % T] = src[b, :, (l // T) * T: l]
    nb.copy_(torch.tensor([l // T for l in lens2], dtype=torch.int32))
    tl.copy_(torch.tensor([l % T for l in lens2], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(out, attention_reference(q, k, v, lens2)) < 1e-2


def test_paged_kv_entry_point_matches_the_tensor_one():
    """``bf16_decode_attention(q, PagedKV)`` (what the cache hands a kernel) = the tensor entry point."""
    from gaac_hf.format import BlockGeometry

    g = torch.Generator(device="cpu").manual_seed(5)
    lens, starts = [3000, 1200], [0, 100]
    k = torch.randn(2, 8, 3000, 128, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(2, 8, 3000, 128, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(2, 32, 128, generator=g).to(torch.bfloat16).to(DEV)
    pk, pv = pack_paged_bf16(k, lens, 64, generator=g), pack_paged_bf16(v, lens, 64, generator=g)
    geom = BlockGeometry(block_size=64, head_dim=128)
    ks = torch.tensor(starts, dtype=torch.int32, device=DEV)
    kv = PagedKV(PagedTensor.raw_only(pk["raw"], pk["table"], pk["tail"], geom),
                 PagedTensor.raw_only(pv["raw"], pv["table"], pv["tail"], geom),
                 pk["num_blocks"], pk["tail_len"], geom, kv_start=ks)
    out = torch.full_like(q, float("nan"))
    bf16_decode_attention(q, kv, out=out)
    ref = _run(q, pk, pv, kv_start=ks)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert _rel_err(out, attention_reference(q, k, v, lens, kv_start=starts)) < 1e-2


def test_deterministic_bits():
    """Same inputs, same config: the same bits (no atomics, fixed merge order)."""
    g = torch.Generator(device="cpu").manual_seed(11)
    k = torch.randn(1, 8, 8192, 128, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(1, 8, 8192, 128, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(1, 32, 128, generator=g).to(torch.bfloat16).to(DEV)
    pk, pv = pack_paged_bf16(k, [8192], 64, generator=g), pack_paged_bf16(v, [8192], 64, generator=g)
    a, b = _run(q, pk, pv), _run(q, pk, pv)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_bad_input_is_refused():
    q = torch.zeros(1, 32, 120, dtype=torch.bfloat16, device=DEV)
    t = torch.zeros(1, 8, 64, 120, dtype=torch.bfloat16, device=DEV)
    tab = torch.zeros(1, 8, 1, dtype=torch.int32, device=DEV)
    n = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="multiple of 16"):
        bf16_decode_attention_tensors(q, t[0], t[0], tab, tab, t, t, n, n)
    q, t = torch.zeros(1, 32, 128, device=DEV), torch.zeros(1, 8, 64, 128, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(TypeError, match="bfloat16"):
        bf16_decode_attention_tensors(q, t[0], t[0], tab, tab, t, t, n, n)
