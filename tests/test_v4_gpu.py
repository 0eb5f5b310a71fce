"""GPU tests of format v4 on Hopper (marker gpu): the CUDA block decoder, the fused register-tile decode
attention (``gaac_hf.kernels.cuda.fused_attention_v4``) and ``GAACCache(format_version=4)``.

Contracts: the CUDA decoder (the attention kernel's own lane code) rebuilds every BF16 bit pattern exactly;
for the same launch (warps, splits) the fused output is bit-identical to the BF16 kernel's on the same K/V
(``twin_config``), within bf16 tolerance of the fp64 reference; generate() with a v4 cache gives the tokens
and logits of the same cache decoded and attended by the BF16 twin at that launch. Outputs are poisoned with
NaN before each launch. Synthetic KV-like data, adversarial blocks (raw groups, BF16-stored blocks, NaN/Inf,
extreme windows), real SmolLM2 K/V (``.kvdump/regtile_real_smollm2.pt`` when carried), ragged batches, left
padding, forced splits, CUDA-graph capture without host syncs.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import replace

import pytest
import torch

from tests.cuda_skip import skip_unless_cuda_kernels

pytestmark = pytest.mark.gpu

skip_unless_cuda_kernels()

from gaac_hf.calibration.synthetic import calibrate, synthetic_kv  # noqa: E402
from gaac_hf.codec.v4 import decode_pool_v4, encode_blocks_v4, pack_blocks_v4, stored_lengths  # noqa: E402
from gaac_hf.format.v4 import GeometryV4  # noqa: E402
from gaac_hf.kernels import LaunchConfig  # noqa: E402
from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors, pack_paged_bf16  # noqa: E402
from gaac_hf.kernels.cuda import fused_attention_v4 as F4  # noqa: E402
from gaac_hf.kernels.cuda.fused_attention_v4 import (decode_blocks_v4_cuda, gaac_decode_attention_v4,  # noqa: E402
                                                     pack_paged_v4, twin_config)
from gaac_hf.kernels.reference import attention_reference  # noqa: E402
from test_cache_gpu import model_table  # noqa: E402,F401 - the module fixture (random SmolLM2-shaped model)
from gaac_hf.models import cache_kwargs  # noqa: E402

DEV = torch.device("cuda")
REPO = pathlib.Path(__file__).resolve().parents[1]
REAL_KV = pathlib.Path(os.environ.get("GAAC_REAL_KV_V4", REPO / ".kvdump" / "regtile_real_smollm2.pt"))


def _needs_hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the v4 kernel is built for Hopper (sm_90a)")


def _rel_err(out, ref):
    return float((out.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30))


def _bases16(k, v):
    return torch.stack([calibrate(k.cpu())[1], calibrate(v.cpu())[1]]).to(k.device)


def _same_bits(a, b):
    diff = a.view(torch.int16) != b.view(torch.int16)
    assert not bool(diff.any()), f"{int(diff.sum())} of {diff.numel()} outputs differ from the BF16 twin"


def _fused(q, kv, config=None, kv_start=None):
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    gaac_decode_attention_v4(q, replace(kv, kv_start=kv_start), launch=config, out=out)
    torch.cuda.synchronize()
    return out


def _twin(q, k, v, lens, T, config, kv_start=None):
    pk, pv = pack_paged_bf16(k, lens, T), pack_paged_bf16(v, lens, T)
    out = torch.full_like(q, float("nan"))
    bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                  pk["num_blocks"], pk["tail_len"], kv_start=kv_start, config=config, out=out)
    torch.cuda.synchronize()
    return out


def _check(q, k, v, kv, lens, T, config=None, kv_start=None):
    out = _fused(q, kv, config, kv_start)
    _same_bits(out, _twin(q, k, v, lens, T, twin_config(q, kv, config), kv_start))
    assert not torch.isnan(out).any(), "an output element was not written (or NaN leaked in)"
    return out


# ---- the CUDA decoder ------------------------------------------------------------------------------------
def _every_pattern(D, T, kind, seed=0):
    """Blocks holding all 65,536 BF16 patterns, each channel seeing every pattern somewhere, with windows that
    make most groups 4-bit (so that patterns far outside them exercise raw groups and BF16 blocks)."""
    g = torch.Generator().manual_seed(seed)
    n = 65536 // (T * D) + 1
    pats = torch.arange(n * T * D, dtype=torch.int64) % 65536
    pats = pats[torch.randperm(pats.numel(), generator=g)]
    x = pats.to(torch.int16).view(torch.bfloat16).reshape(n, T, D)
    base = torch.randint(100, 140, (D,), generator=g).to(torch.uint8)
    near = synthetic_kv((1, 1, 8 * T, D), kind, seed)[0, 0].reshape(8, T, D)
    return torch.cat([x, near]), torch.cat([base.expand(n, D), calibrate(near.reshape(1, 1, 8 * T, D))[1].expand(8, D)])


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("T", [16, 64])
@pytest.mark.parametrize("kind", ["k", "v"])
def test_cuda_decoder_rebuilds_every_pattern(D, T, kind):
    _needs_hopper()
    g = GeometryV4(block_size=T, head_dim=D)
    x, b16 = _every_pattern(D, T, kind)
    enc = encode_blocks_v4(x.to(DEV), b16.to(DEV), g, kind)
    lens = stored_lengths(enc.fits, g)
    offs = torch.cumsum(lens, 0) - lens
    pool = torch.full((int(lens.sum()) + 256,), 0xA5, dtype=torch.uint8, device=DEV)
    entries = pack_blocks_v4(enc, x.to(DEV), pool, offs)
    assert bool(enc.fits.any()) and bool((~enc.fits).any()), "both stored kinds are exercised"
    out = torch.full((x.shape[0], T, D), -1, dtype=torch.int16, device=DEV).view(torch.bfloat16)  # poison (NaN)
    got = decode_blocks_v4_cuda(pool, entries, b16.to(DEV), g, kind, out=out)
    torch.cuda.synchronize()
    assert torch.equal(got.view(torch.int16).cpu(), x.view(torch.int16))
    ref = decode_pool_v4(pool.cpu(), entries.cpu(), b16, g, kind)
    assert torch.equal(ref.view(torch.int16), x.view(torch.int16))


# ---- the fused attention -----------------------------------------------------------------------------------
CASES = [  # (B, Hq, Hkv, D, T, seq_lens)
    (1, 32, 8, 128, 64, [4096 + 37]),
    (3, 32, 8, 128, 64, [1, 700, 2048]),
    (2, 9, 3, 64, 64, [5000, 63]),
    (2, 8, 8, 128, 64, [1000, 129]),   # group 1
    (1, 32, 2, 128, 64, [1500]),       # group 16
    (1, 12, 4, 64, 16, [777]),         # block 16: a warp-step spans several blocks
    (1, 8, 2, 128, 128, [1100]),       # block 128: a block spans two warp-steps
    (1, 32, 8, 128, 64, [0]),          # empty sequence: zeros
    (1, 4, 1, 256, 64, [3000]),        # head_dim 256 (Gemma-3 shape)
    (2, 16, 2, 256, 64, [1300, 70]),   # head_dim 256, group 8
]


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", CASES)
@pytest.mark.parametrize("cfg", [None, LaunchConfig(num_splits=1), LaunchConfig(num_splits=3, num_warps=4),
                                 LaunchConfig(num_warps=4, num_stages=3, ctas_per_sm=2),
                                 LaunchConfig(num_splits=11, num_warps=4, merge_chunk=4),  # two-level merge, 4+4+3
                                 LaunchConfig(merge_chunk=0)])  # one-level merge where the default has two
def test_bit_identical_to_bf16_twin_and_close_to_fp64(B, HQ, HKV, D, T, lens, cfg):
    _case_check(B, HQ, HKV, D, T, lens, cfg)


# launches whose full slots do not fit shared memory: the planner gives them compact slots (COMPACT_SLOTS), where a
# tile with a kind stored as BF16 stages K over both slots and copies V after it
COMPACT = {64: [LaunchConfig(num_warps=8, num_stages=8, ctas_per_sm=1)], 128: [LaunchConfig(num_warps=8, num_stages=4)],
           256: [LaunchConfig(num_warps=8), LaunchConfig(num_warps=4, ctas_per_sm=2)]}


@pytest.mark.parametrize("B,HQ,HKV,D,T,lens", CASES)
def test_compact_slots_bit_identical(B, HQ, HKV, D, T, lens):
    for cfg in COMPACT[D]:
        assert F4.plan(B, HKV, HQ // HKV, T, D, 65536, DEV, cfg)["defines"]["COMPACT_SLOTS"] == 1, cfg
        _case_check(B, HQ, HKV, D, T, lens, cfg)


def _case_check(B, HQ, HKV, D, T, lens, cfg):
    _needs_hopper()
    seed = hash((B, HQ, HKV, D, T, tuple(lens))) % 2**31
    S = max(max(lens), 1)
    k = synthetic_kv((B, HKV, S, D), "k", seed).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", seed + 1).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v4(k, v, lens, T, _bases16(k, v), generator=torch.Generator().manual_seed(seed))
    if D == 256 and cfg is not None and cfg.ctas_per_sm:  # 16 KB slots: 2 CTAs fit with 2 warps x 2 stages
        cfg = LaunchConfig(num_warps=2, num_stages=2, ctas_per_sm=2)
    out = _check(q, k, v, kv, lens, T, cfg)
    if max(lens) == 0:
        assert torch.equal(out, torch.zeros_like(out))
        return
    assert _rel_err(out, attention_reference(q, k, v, lens)) < 1e-2


@pytest.mark.parametrize("D", [64, 128, 256])
def test_adversarial_blocks_bit_identical(D):
    """Raw groups (1-3 per tile), BF16-stored blocks, NaN / Inf / subnormal values, windows at 0 and 255."""
    _needs_hopper()
    B, HKV, HQ, T, S = 2, 2, 8, 64, 2048 + 50
    g = torch.Generator().manual_seed(D)
    k = synthetic_kv((B, HKV, S, D), "k", 7).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 8).to(DEV)
    for x in (k, v):
        flat = x.view(torch.int16).view(-1)
        n = flat.numel()
        idx = torch.randint(0, n, (n // 3000,), generator=g).to(DEV)  # scattered raw groups
        flat[idx] = torch.randint(-32768, 32767, (idx.numel(),), generator=g, dtype=torch.int16).to(DEV)
        x[0, 0, 64:128] = torch.tensor(float("nan"), dtype=torch.bfloat16)  # whole block of NaN: BF16-stored
        x[1, 1, 300:301] = torch.tensor(float("inf"), dtype=torch.bfloat16)
    k[0, 1, 256:320] = torch.tensor(float("nan"), dtype=torch.bfloat16)  # K stored as BF16, V compressed
    v[1, 0, 512:576] = torch.tensor(float("nan"), dtype=torch.bfloat16)  # and the other way round
    bases = _bases16(k, v)
    bases[0, 0, :8] = 0
    bases[1, 1, -8:] = 255
    kv = pack_paged_v4(k, v, [S, S - 700], T, bases)
    assert bool((kv.k.table & 1).any()) and not bool((kv.k.table & 1).all())
    kb, vb = (kv.k.table & 1).bool(), (kv.v.table & 1).bool()
    assert bool((kb & ~vb).any()) and bool((vb & ~kb).any()), "tiles with one kind stored as BF16 are exercised"
    q = torch.randn(B, HQ, D, generator=g).to(torch.bfloat16).to(DEV)
    # NaN / Inf in the K/V make the outputs of those heads NaN for the twin as for the fused kernel: compare bits
    for cfg in (None, LaunchConfig(num_splits=5, num_warps=4), *COMPACT[D]):
        out = _fused(q, kv, cfg)
        _same_bits(out, _twin(q, k, v, [S, S - 700], T, twin_config(q, kv, cfg)))


@pytest.mark.parametrize("D", [64, 128])
def test_left_padding_with_garbage_in_compressed_blocks(D):
    _needs_hopper()
    B, HKV, HQ, T, S = 3, 2, 6, 64, 3000
    k = synthetic_kv((B, HKV, S, D), "k", 11).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 12).to(DEV)
    start = torch.tensor([0, 130, 1999], dtype=torch.int32, device=DEV)
    for b in range(B):  # padded positions hold values the encoder must store and the kernel must not attend
        k[b, :, : int(start[b])] = 1e30
        v[b, :, : int(start[b])] = -7
    kv = pack_paged_v4(k, v, [S] * B, T, _bases16(k[:, :, 2000:], v[:, :, 2000:]))
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEV)
    for cfg in (None, LaunchConfig(num_splits=4)):
        out = _check(q, k, v, kv, [S] * B, T, cfg, kv_start=start)
        ref = torch.stack([attention_reference(q[b: b + 1], k[b: b + 1, :, int(start[b]):], v[b: b + 1, :, int(start[b]):],
                                               [S - int(start[b])])[0] for b in range(B)])
        assert _rel_err(out, ref) < 1e-2


def test_real_smollm2_kv_bit_identical():
    _needs_hopper()
    if not REAL_KV.exists():
        pytest.skip(f"{REAL_KV} not here (lab/experiments/regtile/dump_real.py makes it on the CPU)")
    d = torch.load(REAL_KV)
    for B, S in ((1, 32768 - 17), (4, 4096 + 5)):
        k = d["k"][:, :, :S].expand(B, -1, -1, -1).contiguous().to(DEV)
        v = d["v"][:, :, :S].expand(B, -1, -1, -1).contiguous().to(DEV)
        bases = torch.stack([d["b16k"], d["b16v"]]).to(torch.uint8).to(DEV)
        kv = pack_paged_v4(k, v, [S] * B, 64, bases)
        share = float((kv.k.table & 1).float().mean())
        assert share < 0.05, f"{share:.1%} of real K blocks stored BF16"
        q = torch.randn(B, 9, 64, generator=torch.Generator().manual_seed(B)).to(torch.bfloat16).to(DEV)
        for cfg in (None, LaunchConfig(num_splits=2, num_warps=4)):
            out = _check(q, k, v, kv, [S] * B, 64, cfg)
            assert _rel_err(out, attention_reference(q, k, v, [S] * B)) < 1e-2


def test_graph_capture_and_no_host_sync():
    _needs_hopper()
    B, HQ, HKV, D, T, S = 2, 32, 8, 128, 64, 4096
    k = synthetic_kv((B, HKV, S, D), "k", 3).to(DEV)
    v = synthetic_kv((B, HKV, S, D), "v", 4).to(DEV)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(DEV)
    kv = pack_paged_v4(k, v, [S, S], T, _bases16(k, v))
    out = torch.full_like(q, float("nan"))
    call = lambda: gaac_decode_attention_v4(q, kv, out=out)  # noqa: E731
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
    kv.num_blocks.copy_(torch.tensor([16, 1], dtype=torch.int32))
    kv.tail_len.zero_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(out, attention_reference(q, k, v, [1024, 64])) < 1e-2


def test_refuses_wrong_inputs():
    _needs_hopper()
    k = synthetic_kv((1, 2, 256, 128), "k", 0).to(DEV)
    kv = pack_paged_v4(k, k, [256], 64, _bases16(k, k))
    q = torch.randn(1, 8, 128, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match="K and V tiles"):
        gaac_decode_attention_v4(q, replace(kv, k=kv.v))
    with pytest.raises(ValueError, match="contiguous bfloat16"):
        gaac_decode_attention_v4(q.float(), kv)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        gaac_decode_attention_v4(q[:, :7].contiguous(), kv)
    k = synthetic_kv((1, 1, 256, 256), "k", 0).to(DEV)
    kv = pack_paged_v4(k, k, [256], 64, _bases16(k, k))
    with pytest.raises(ValueError, match="at most 8 query heads"):
        gaac_decode_attention_v4(torch.randn(1, 12, 256, device=DEV).to(torch.bfloat16), kv)


# ---- GAACCache(format_version=4) -------------------------------------------------------------------------------
def _twin_attention_v4(query, layer, kv_start, scaling):
    """Decode the v4 layer, page it as BF16 and attend with the BF16 CUDA twin at the fused v4 launch."""
    k, v = layer.full_kv()
    B, hkv, S, D = k.shape
    T = layer.geometry.block_size
    q = query[:, :, 0, :].contiguous()
    kv = layer.paged_kv(kv_start)
    pk, pv = pack_paged_bf16(k, [S] * B, T), pack_paged_bf16(v, [S] * B, T)
    out = bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                        pk["num_blocks"], pk["tail_len"], kv_start=kv_start, scale=scaling,
                                        active_blocks=kv.active_blocks, config=twin_config(q, kv))
    return out.unsqueeze(1)


def test_v4_cache_generate_is_bit_identical_to_the_bf16_twin(model_table, monkeypatch):
    _needs_hopper()
    from test_cache import attention, count_calls, same_bits
    from test_cache_gpu import _prompt

    import gaac_hf.cache.fused_v3 as fv3
    from gaac_hf.cache import GAACCache

    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 150, seed=6).items()}
    kw = dict(do_sample=False, max_new_tokens=24, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad(), attention(model, "gaac"):
        calls = count_calls(monkeypatch, fv3, "fused_v3_attention")
        cache = GAACCache(model.config, calibration=table, format_version=4)
        fused = model.generate(**inputs, **cache_kwargs(model.generate, cache), **kw)
        assert all(layer.format_version == 4 and layer.fused_v3 for layer in cache.layers)
        assert len(calls) == 23 * len(cache.layers), "every decode step of every layer ran the fused v4 kernel"
        monkeypatch.setattr(fv3, "fused_v3_attention", _twin_attention_v4)
        ref = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, format_version=4)), **kw)
    assert torch.equal(fused.sequences, ref.sequences)
    for a, b in zip(fused.logits, ref.logits):
        assert same_bits(a, b)
    assert cache.stats()["format_version"] == 4 and cache.verify()["slot_rows"] > 0


def test_v4_cache_decode_steps_never_sync_the_host(model_table):
    """Decode steps that complete blocks (encode, place at the device counter, attend) run under torch's sync
    debug mode "error"."""
    _needs_hopper()
    from test_cache import attention

    from gaac_hf.cache import GAACCache

    model, table = model_table
    ids = torch.randint(100, 49000, (2, 300), device="cuda")
    cache = GAACCache(model.config, calibration=table, format_version=4)
    with torch.no_grad(), attention(model, "gaac"):
        tok = model(input_ids=ids, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(40):  # crosses block boundaries (block size 16)
                tok = model(input_ids=tok, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert cache.layers[0].pools[0].sync_free and cache.verify()["slot_rows"] > 0
