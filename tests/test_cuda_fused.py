"""GPU tests of the fused GAAC v3 decode attention (``gaac_hf.kernels.cuda.fused_attention``).

The contract: for the same launch (warps, splits) the fused output is **bit-identical** to the BF16
kernel's (``attention.bf16_decode_attention_tensors``) on the same K/V, because both run the same
MMA code (``include/gaac/attend.cuh``) on the same rows; and within bf16 tolerance of the fp64
reference. Checked on synthetic KV-like data, real SmolLM2 K/V blocks (when the dump exists),
adversarial blocks (every mode mix, raw groups, BF16-stored blocks, extreme bases, NaN/Inf), entry
lists longer than the staged window, left padding with garbage in compressed blocks, batches with
ragged lengths, forced splits, outputs poisoned with NaN, CUDA-graph capture and no host sync.
"""
from __future__ import annotations

import os
import pathlib

import pytest
import torch

from tests.cuda_skip import skip_unless_cuda_kernels

pytestmark = pytest.mark.gpu

skip_unless_cuda_kernels()

from gaac_hf.calibration.synthetic import calibrate, synthetic_kv  # noqa: E402
from gaac_hf.kernels import LaunchConfig  # noqa: E402
from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors, pack_paged_bf16  # noqa: E402
from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3, pack_paged_v3  # noqa: E402
from gaac_hf.kernels.reference import attention_reference  # noqa: E402

DEV = torch.device("cuda")
REAL_KV = pathlib.Path(os.environ.get("GAAC_REAL_KV", pathlib.Path(__file__).parents[1] / ".kvdump" / "smollm2_kv_v3.pt"))


def _rel_err(out, ref):
    return float((out.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30))


def _bases(k, v):
    bk, bv = calibrate(k.cpu()), calibrate(v.cpu())
    return torch.stack([torch.stack(bk), torch.stack(bv)]).to(k.device)


def _fused(q, kv, config, kv_start=None):
    from dataclasses import replace

    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    gaac_decode_attention_v3(q, replace(kv, kv_start=kv_start), launch=config, out=out)
    torch.cuda.synchronize()
    return out


def _twin(q, k, v, lens, T, config, kv_start=None):
    """The BF16 kernel on the same K/V and launch: the bit-identity reference."""
    pk, pv = pack_paged_bf16(k, lens, T), pack_paged_bf16(v, lens, T)
    out = torch.full_like(q, float("nan"))
    bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                  pk["num_blocks"], pk["tail_len"], kv_start=kv_start, config=config, out=out)
    torch.cuda.synchronize()
    return out


def _same_bits(a, b):
    diff = a.view(torch.int16) != b.view(torch.int16)
    assert not bool(diff.any()), f"{int(diff.sum())} of {diff.numel()} outputs differ from the BF16 twin"


def _check_both(q, k, v, kv, lens, T, config, kv_start=None):
    out = _fused(q, kv, config, kv_start=kv_start)
    twin = _twin(q, k, v, lens, T, config, kv_start=kv_start)
    _same_bits(out, twin)
    return out


CASES = [  # (B, Hq, Hkv, D, T, seq_lens)
    (1, 32, 8, 128, 64, [4096 + 37]),
    (3, 32, 8, 128, 64, [1, 700, 2048]),
    (2, 9, 3, 64, 64, [5000, 63]),
    (1, 4, 1, 256, 64, [3000]),
    (2, 8, 8, 128, 64, [1000, 129]),   # group 1
    (1, 32, 2, 128, 64, [1500]),       # group 16 (two n-tiles)
    (1, 16, 2, 256, 64, [1300]),       # d=256 group 8
    (1, 12, 4, 64, 16, [777]),         # block 16: a stage spans four blocks
    (1, 8, 2, 128, 128, [1100]),       # block 128: a block spans two stages
    (1, 32, 8, 128, 64, [0]),          # empty sequence: zeros
]


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", CASES)
@pytest.mark.parametrize("splits,loader", [(None, None), (1, "cp.async"), (3, "cp.async"), (3, None)])
def test_bit_identical_to_bf16_twin_and_close_to_fp64(B, HQ, HKV, D, T, lens, splits, loader):
    seed = hash((B, HQ, HKV, D, T, tuple(lens))) % 2**31
    S = max(max(lens), 1)
    k = synthetic_kv((B, HKV, S, D), "k", seed).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", seed + 1).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v3(k, v, lens, T, _bases(k, v), generator=torch.Generator().manual_seed(seed))
    # 4 consumer warps at d = 256 bring 8 producers and need more than 227 KB (the planner refuses it)
    cfg = LaunchConfig(num_splits=splits, num_warps=4 if D < 256 else 2, loader=loader)
    if splits is None:  # the fused planner's own choice: compare with the twin at the same split count
        from gaac_hf.kernels.cuda.fused_attention import plan

        p = plan(B, HKV, HQ // HKV, T, D, kv.k.table.shape[2] * T + T, DEV, LaunchConfig())
        cfg = LaunchConfig(num_splits=p["splits"], num_warps=p["warps"])
        out = _fused(q, kv, LaunchConfig())
        _same_bits(out, _twin(q, k, v, lens, T, cfg))
    else:
        out = _check_both(q, k, v, kv, lens, T, cfg)
    assert not torch.isnan(out).any(), "an output element was not written (or NaN leaked in)"
    if max(lens) == 0:
        assert torch.equal(out, torch.zeros_like(out))
        return
    assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", [CASES[1], CASES[2], CASES[3], CASES[6], CASES[8]])
@pytest.mark.parametrize("pseg,kinds", [(1, 2), (2, 1), (1, 1)])
def test_producer_shapes_bit_identical(B, HQ, HKV, D, T, lens, pseg, kinds):
    """producer_segments=1: twice (four times at d=256) the producer warps, each decoding one segment;
    producer_kinds=1: one producer for K and one for V of each group of segments."""
    S = max(lens)
    k = synthetic_kv((B, HKV, S, D), "k", 5).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 6).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v3(k, v, lens, T, _bases(k, v))
    for splits in (1, 3):
        cfg = LaunchConfig(num_splits=splits, num_warps=2, producer_segments=pseg, producer_kinds=kinds)
        out = _check_both(q, k, v, kv, lens, T, cfg)
    assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", [CASES[0], CASES[1], CASES[2], CASES[3], CASES[7], CASES[8]])
@pytest.mark.parametrize("kinds", [1, 2])
def test_one_slot_k_ring_bit_identical(B, HQ, HKV, D, T, lens, kinds):
    """decoded_k_slots=1: the consumer frees its one K buffer once S is computed (the `kfree` barrier)
    and the K producer refills it while the consumer works on V; at d <= 128 also at 4 CTAs per SM
    (the register cap the extra CTA brings)."""
    S = max(lens)
    k = synthetic_kv((B, HKV, S, D), "k", 7).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 8).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v3(k, v, lens, T, _bases(k, v))
    for splits, per_sm in ((1, None), (3, 4 if D <= 128 else None)):
        cfg = LaunchConfig(num_splits=splits, num_warps=2, producer_kinds=kinds, decoded_k_slots=1, ctas_per_sm=per_sm,
                           num_stages=2 if per_sm else None)
        out = _check_both(q, k, v, kv, lens, T, cfg)
    assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", CASES)
def test_decoded_slots_bit_identical(B, HQ, HKV, D, T, lens):
    """decoded_slots=3 (a deeper decoded ring: producers run further ahead of the consumer) writes the same
    rows, so the output bits must not change: at 1 and 3 splits, and with windows moved up so that entry
    lists leave the staged window and take several 32-entry steps. (It replaces session 12's tests of the
    software-pipelined producers, measured slower and removed; call N1's sweep checked this launch's bits.)"""
    S = max(max(lens), 1)
    k = synthetic_kv((B, HKV, S, D), "k", 23).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 24).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(23)).to(torch.bfloat16).to(DEV)
    bases = _bases(k, v)
    for shift in (0, 4):
        b = bases.clone()
        b[:, 0] = (b[:, 0].int() + shift).clamp(max=248).to(torch.uint8)
        kv = pack_paged_v3(k, v, lens, T, b)
        for splits in (1, 3):
            out = _check_both(q, k, v, kv, lens, T, LaunchConfig(num_splits=splits, num_warps=2, decoded_slots=3))
    if max(lens):
        assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2
    else:
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("shift", [2, 4])
def test_badly_fitting_windows_long_entry_lists(shift):
    """Windows moved up by `shift` exponents: 30-90% of groups wide, so entry lists overflow a
    producer's 32-word window and take several 32-entry steps (the global-memory path)."""
    B, HQ, HKV, D, T, lens = 2, 32, 8, 128, 64, [2000, 1337]
    k = synthetic_kv((B, HKV, 2000, D), "k", 11).to(DEV)
    v = synthetic_kv((B, HKV, 2000, D), "v", 12).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEV)
    bases = _bases(k, v)
    bases[:, 0] = (bases[:, 0].int() + shift).clamp(max=248).to(torch.uint8)
    kv = pack_paged_v3(k, v, lens, T, bases)
    for warps, loader in ((2, None), (4, "cp.async")):
        out = _check_both(q, k, v, kv, lens, T, LaunchConfig(num_splits=4, num_warps=warps, loader=loader))
    assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2


@pytest.mark.parametrize("D", [64, 128, 256])
def test_left_padding_with_garbage_in_compressed_blocks(D):
    """Padding positions hold NaN / Inf inside compressed blocks: the mask keeps them out."""
    B, HQ, HKV, T = 3, 8, 2, 64
    lens, starts = [900, 1500, 64], [0, 700, 63]
    S = max(lens)
    k = synthetic_kv((B, HKV, S, D), "k", D).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", D + 1).to(DEV)
    bases = _bases(k, v)
    for b, s0 in enumerate(starts):
        k[b, :, :s0] = float("nan")
        v[b, :, :s0] = float("inf")
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(D)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v3(k, v, lens, T, bases)
    ks = torch.tensor(starts, dtype=torch.int32, device=DEV)
    for splits, warps in ((1, 2), (4, 4 if D < 256 else 1)):
        out = _check_both(q, k, v, kv, lens, T, LaunchConfig(num_splits=splits, num_warps=warps), kv_start=ks)
        assert not torch.isnan(out).any()
        assert _rel_err(out, attention_reference(q, k, v, lens, kv_start=starts)) < 1e-2


def _adversarial_cache(D):
    """One kv head per adversarial block (its own bases): the block, then its rows rolled, then a tail."""
    from gaac_hf.format.v3 import GeometryV3
    from tests.v3_cases import adversarial_blocks

    T = 64
    x, b8, b16 = adversarial_blocks(GeometryV3(block_size=T, head_dim=D))
    H = x.shape[0]
    seq = torch.cat([x, x.roll(7, dims=1), x.roll(-3, dims=1)[:, :29]], dim=1)  # [H, 2T + 29, D]
    bases = torch.stack([b8, b16])  # [2, H, D]
    return seq.unsqueeze(0), torch.stack([bases, bases]), H


@pytest.mark.parametrize("D", [64, 128, 256])
def test_adversarial_blocks_bit_identical(D):
    """Every mode mix, raw groups with wrapping codes, blocks that do not fit (stored as BF16), NaN
    payloads, +-Inf, +-0, subnormals, as K and as V: the decoded rows feed the MMA exactly as the BF16
    rows do (NaN outputs included: the comparison is of bit patterns)."""
    x, bases, H = _adversarial_cache(D)
    k = x.to(DEV)
    v = x.flip(1).contiguous().to(DEV)  # V: the same blocks in another order, other rows in the tail
    kv = pack_paged_v3(k, v, [k.shape[2]], 64, bases.to(DEV))
    q = (torch.randn(1, 2 * H, D, generator=torch.Generator().manual_seed(D)) * 0.01).to(torch.bfloat16).to(DEV)
    assert bool((kv.k.table[0, :, :2] & 1).any()), "some adversarial block must be stored as BF16"
    assert bool((~kv.k.table[0, :, :2] & 1).any()), "and some compressed"
    for splits, k_slots in ((1, None), (2, None), (2, 1)):
        _check_both(q, k, v, kv, [k.shape[2]], 64,
                    LaunchConfig(num_splits=splits, num_warps=4 if D < 256 else 2, decoded_k_slots=k_slots))


@pytest.mark.skipif(not REAL_KV.exists(), reason=f"real K/V dump {REAL_KV} absent (python eval/compression_v3.py --dump)")
def test_real_smollm2_kv_bit_identical():
    """Real SmolLM2 K/V blocks (8 consecutive blocks share one head's calibrated bases in the dump):
    six groups form 3 K heads and 3 V heads of a 512-token + tail cache, for several layers."""
    d = torch.load(REAL_KV)
    x, b8, b16 = d["x"], d["b8"], d["b16"]
    D, T = x.shape[2], x.shape[1]
    groups = x.shape[0] // 8
    for layer in range(0, groups // 6, 5):
        gi = [6 * layer + j for j in range(6)]
        blocks = torch.stack([x[8 * g: 8 * g + 8].reshape(8 * T, D) for g in gi])  # [6, 512, D]
        tail = blocks[:, :40].flip(1)
        seq = torch.cat([blocks, tail], dim=1)  # [6, 552, D]
        k, v = seq[:3].unsqueeze(0).to(DEV), seq[3:].unsqueeze(0).to(DEV)
        bases = torch.stack([torch.stack([b8[[8 * g for g in gi[:3]]], b16[[8 * g for g in gi[:3]]]]),
                             torch.stack([b8[[8 * g for g in gi[3:]]], b16[[8 * g for g in gi[3:]]]])]).to(DEV)
        kv = pack_paged_v3(k, v, [seq.shape[1]], T, bases)
        assert not bool((kv.k.table & 1).any()), "real K/V blocks all compress"
        q = torch.randn(1, 9, D, generator=torch.Generator().manual_seed(layer)).to(torch.bfloat16).to(DEV)
        for splits, k_slots in ((1, None), (3, None), (3, 1)):
            out = _check_both(q, k, v, kv, [seq.shape[1]], T,
                              LaunchConfig(num_splits=splits, num_warps=4, decoded_k_slots=k_slots))
            assert _rel_err(out, attention_reference(q, k, v, [seq.shape[1]])) < 1e-2


def test_graph_capture_and_no_host_sync():
    """Captured once, replayed after the lengths changed on the device: same bits as eager."""
    B, HQ, HKV, D, T = 2, 32, 8, 128, 64
    S = 4096
    k = synthetic_kv((B, HKV, S, D), "k", 3).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 4).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v3(k, v, [S, S], T, _bases(k, v))
    out = torch.full_like(q, float("nan"))
    call = lambda: gaac_decode_attention_v3(q, kv, out=out)  # noqa: E731
    call()
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
    assert _rel_err(out, attention_reference(q, k, v, [S, S])) < 1e-2
    # shorter sequences, same graph: whole blocks only (the tails hold the last partial block)
    lens2 = [1024, 64]
    kv.num_blocks.copy_(torch.tensor([l // T for l in lens2], dtype=torch.int32))
    kv.tail_len.zero_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(out, attention_reference(q, k, v, lens2)) < 1e-2


def test_refuses_launches_that_do_not_fit_shared_memory():
    k = synthetic_kv((1, 1, 300, 256), "k", 0).to(DEV)
    kv = pack_paged_v3(k, k, [300], 64, _bases(k, k))
    q = torch.zeros(1, 4, 256, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="shared memory"):
        gaac_decode_attention_v3(q, kv, launch=LaunchConfig(num_warps=4))


def test_refuses_v2_caches_and_unsupported_shapes():
    from gaac_hf.format import BlockGeometry
    from gaac_hf.kernels import PagedKV, PagedTensor

    k = synthetic_kv((1, 2, 200, 128), "k", 0).to(DEV)
    pk = pack_paged_bf16(k, [200], 64)
    geom = BlockGeometry(block_size=64, head_dim=128)
    pt = PagedTensor.raw_only(pk["raw"], pk["table"], pk["tail"], geom)
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(TypeError, match="PagedTensorV3"):
        gaac_decode_attention_v3(q, PagedKV(pt, pt, pk["num_blocks"], pk["tail_len"], geom))
    k80 = synthetic_kv((1, 2, 200, 80), "k", 0).to(DEV)
    kv80 = pack_paged_v3(k80, k80, [200], 64, _bases(k80, k80))
    with pytest.raises(ValueError, match="head_dim"):
        gaac_decode_attention_v3(torch.zeros(1, 4, 80, dtype=torch.bfloat16, device=DEV), kv80)
