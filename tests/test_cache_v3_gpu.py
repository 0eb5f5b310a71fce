"""GAACCache(format_version=3) on CUDA (marker gpu): with ``fused=False`` (decode + SDPA) v3 storage on
the device stays bit-identical to DynamicCache + sdpa, batch ops included; what the cache hands a
kernel (``paged_kv()``) is a v3 PagedKV on the device whose blocks decode (v3 CUDA decoder) to
DynamicCache's bits. On Hopper v3 is the default and decode steps run the fused v3 kernel, whose
generate() tokens and logits are bit-identical to decoding the same cache and attending with the BF16
CUDA twin at the same launch. Random-weight SmolLM2-shaped model, as tests/test_cache_gpu.py.
"""
from __future__ import annotations

import pytest
import torch
from test_cache import attention, count_calls, same_bits
from test_cache_gpu import _prompt, model_table  # noqa: F401 - the module fixture
from transformers import DynamicCache

import gaac_hf.cache.attention as gattn
import gaac_hf.cache.fused_v3 as fv3
from gaac_hf.cache import GAACCache
from gaac_hf.codec.v3 import decode_pool_v3
from gaac_hf.kernels.paged import PagedTensorV3
from gaac_hf.models import cache_kwargs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_v3_on_cuda_generate_is_bit_identical(model_table):
    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 150, seed=1).items()}
    kw = dict(do_sample=False, max_new_tokens=20, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(**inputs, **cache_kwargs(model.generate, DynamicCache(config=model.config)), **kw)
        cache = GAACCache(model.config, calibration=table, format_version=3, fused=False)
        with attention(model, "gaac"):
            out = model.generate(**inputs, **cache_kwargs(model.generate, cache), **kw)
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)
    assert cache.layers[0].format_version == 3 and cache.layers[0].pools[0].pool.is_cuda
    assert cache.stats()["format_version"] == 3 and cache.verify()["slot_rows"] > 0


def test_v3_on_cuda_paged_kv_and_batch_ops(model_table):
    model, table = model_table
    ids = _prompt(2, 200, seed=2)["input_ids"].cuda()
    dyn, gaac = DynamicCache(config=model.config), GAACCache(model.config, calibration=table, format_version=3)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, dyn))
        with attention(model, "gaac"):
            model(ids, **cache_kwargs(model, gaac))
    for op, arg in (("reorder_cache", torch.tensor([1, 0], device="cuda")), ("batch_repeat_interleave", 2),
                    ("batch_select_indices", torch.tensor([0, 3], device="cuda"))):
        getattr(gaac, op)(arg)
        getattr(dyn, op)(arg)
    gaac.crop(-30)
    dyn.crop(-30)
    layer = gaac.layers[5]
    kv = layer.paged_kv()
    assert isinstance(kv.k, PagedTensorV3) and kv.k.pool.is_cuda and kv.k.table.dtype == torch.int64
    assert kv.k.pool.numel() - layer.pools[0].used >= PagedTensorV3.GUARD_BYTES
    nb, t = layer.num_blocks, layer.geometry.block_size
    for kind, (p, want) in enumerate(((kv.k, dyn.layers[5].keys), (kv.v, dyn.layers[5].values))):
        e = p.table[:, :, :nb].reshape(-1)
        heads = torch.arange(p.table.shape[1], device="cuda").view(1, -1, 1).expand(p.table.shape[0], -1, nb).reshape(-1)
        got = layer.pools[kind].gather(e, heads)  # the CUDA decoder when it loads
        ref = decode_pool_v3(p.pool.cpu(), e.cpu(), layer.pools[kind].base8[heads].cpu(), layer.pools[kind].base16[heads].cpu(), layer.geometry)
        blocks = want[:, :, : nb * t].reshape(-1, t, want.shape[-1])
        assert same_bits(got.cpu(), blocks.cpu()) and same_bits(ref, blocks.cpu())
        assert same_bits(layer.full(kind), want)


def _needs_fused_v3():
    reason = fv3.why_unavailable(torch.device("cuda"), 64, 3)
    if reason is not None:
        pytest.skip(reason)


def _twin_attention(query, layer, kv_start, scaling):
    """Decode the layer, page it as BF16 and attend with the BF16 CUDA twin at the fused kernel's launch."""
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors, pack_paged_bf16
    from gaac_hf.kernels.cuda.fused_attention import plan

    k, v = layer.full_kv()
    B, hkv, S, D = k.shape
    T = layer.geometry.block_size
    q = query[:, :, 0, :].contiguous()
    blocks = max(layer.num_blocks, 1)
    p = plan(B, hkv, q.shape[1] // hkv, T, D, blocks * T + T, q.device, LaunchConfig())
    pk, pv = pack_paged_bf16(k, [S] * B, T), pack_paged_bf16(v, [S] * B, T)
    out = bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                        pk["num_blocks"], pk["tail_len"], kv_start=kv_start, scale=scaling,
                                        active_blocks=blocks,
                                        config=LaunchConfig(num_splits=p["splits"], num_warps=p["warps"]))
    return out.unsqueeze(1)


@pytest.mark.parametrize("requested,stored", [(3, 3), (None, 4)])
def test_every_decode_step_runs_the_fused_kernel_of_the_stored_format(model_table, monkeypatch, requested, stored):
    """format_version=3 stores v3; a cache built without it stores v4 on Hopper (pool_v3.default_format). Either way
    every decode step of every layer runs the fused kernel of that format."""
    _needs_fused_v3()
    if fv3.why_unavailable(torch.device("cuda"), 64, 3, stored) is not None:
        pytest.skip(fv3.why_unavailable(torch.device("cuda"), 64, 3, stored))
    model, table = model_table
    calls = count_calls(monkeypatch, fv3, "fused_v3_attention")
    inputs = {k: v.cuda() for k, v in _prompt(2, 90, seed=4).items()}
    cache = GAACCache(model.config, calibration=table, format_version=requested)
    with torch.no_grad(), attention(model, "gaac"):
        model.generate(**inputs, **cache_kwargs(model.generate, cache), max_new_tokens=4, do_sample=False, cache_implementation=None,
                       pad_token_id=0)
    assert all(layer.format_version == stored and layer.fused_v3 for layer in cache.layers)
    assert len(calls) == 3 * len(cache.layers)  # every decode step, every layer (the prefill is not a decode step)


def test_fused_v3_generate_is_bit_identical_to_the_bf16_twin(model_table, monkeypatch):
    """Tokens and every step's logits of generate() with the fused kernel equal those of the same cache
    decoded and attended by the BF16 CUDA twin at the same launch (left padding, blocks crossing the
    tail, 3 rows)."""
    _needs_fused_v3()
    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 150, seed=6).items()}
    kw = dict(do_sample=False, max_new_tokens=24, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad(), attention(model, "gaac"):
        fused = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, format_version=3)), **kw)
        calls = []

        def twin(*a, **k):
            calls.append(1)
            return _twin_attention(*a, **k)

        monkeypatch.setattr(fv3, "fused_v3_attention", twin)
        ref = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, format_version=3)), **kw)
    assert calls, "the twin path did not run"
    assert torch.equal(fused.sequences, ref.sequences)
    for a, b in zip(fused.logits, ref.logits):
        assert same_bits(a, b)


def test_fused_v3_matches_sdpa_within_bf16_tolerance(model_table):
    _needs_fused_v3()
    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 120, seed=7).items()}
    cache = GAACCache(model.config, calibration=table, format_version=3)
    with torch.no_grad(), attention(model, "gaac"):
        model(**inputs, **cache_kwargs(model, cache))
    layer, attn = cache.layers[7], model.model.layers[7].self_attn
    q = torch.randn(3, 9, 1, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    mask = inputs["attention_mask"].bool()[:, None, None, :]
    k, v = layer.full_kv()
    ref, _ = gattn._sdpa()(attn, q.double().to(torch.bfloat16), k, v, mask, scaling=attn.scaling)
    out = fv3.fused_v3_attention(q, layer, gattn._kv_start(mask), attn.scaling)
    assert out.shape == ref.shape == (3, 1, 9, 64)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_unsupported_shapes_are_refused_with_the_reason():
    _needs_fused_v3()
    assert "head_dim 96" in fv3.why_unavailable(torch.device("cuda"), 96, 4)
    assert "query heads per kv head" in fv3.why_unavailable(torch.device("cuda"), 256, 12)
    assert fv3.why_unavailable(torch.device("cuda"), 128, 4) is None


@pytest.mark.parametrize("checksums", [False, True])
def test_v3_decode_steps_never_sync_the_host(model_table, monkeypatch, checksums):
    """A v3 store on CUDA places a decode step's blocks at device offsets (pool_v3 ``sync_free``): decode
    steps that complete blocks run under torch's sync debug mode "error" (the fused v3 kernel where
    it serves the layer), and with the prefill leave every layer's pool bytes, tables and K/V bit-identical to the same
    steps with pools that size each store on the host (``sync_free=False``)."""
    import gaac_hf.cache.layer as layer_mod
    from gaac_hf.cache.pool_v3 import GUARD

    model, table = model_table
    ids = torch.randint(100, 49000, (2, 300), device="cuda")
    cls, state = layer_mod._BlockPoolV3, {}
    monkeypatch.setattr(layer_mod, "_BlockPoolV3", lambda *a, **k: cls(*a, sync_free=state["free"], **k))
    caches = {}
    for free in (False, True):
        state["free"] = free
        cache = caches[free] = GAACCache(model.config, calibration=table, format_version=3, checksums=checksums)
        with torch.no_grad(), attention(model, "gaac"):
            # the prefill sizes its store exactly (one sync per pool: pool_v3 docstring); decode steps never sync
            tok = model(input_ids=ids, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error" if free else 0)
            try:
                for _ in range(40):  # 300 + 40 tokens cross block boundaries (block size 16)
                    tok = model(input_ids=tok, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    exact, free = caches[False], caches[True]
    assert free.layers[0].pools[0].sync_free and not exact.layers[0].pools[0].sync_free
    for la, lb in zip(exact.layers, free.layers):
        for kind in (0, 1):
            pa, pb = la.pools[kind], lb.pools[kind]
            assert pa.used == pb.used and torch.equal(pa.pool[: pa.used], pb.pool[: pb.used])
            assert torch.equal(la.tables[kind][:, :, : la.num_blocks], lb.tables[kind][:, :, : lb.num_blocks])
        ka, va = la.full_kv()
        kb, vb = lb.full_kv()
        assert same_bits(ka, kb) and same_bits(va, vb)
        for p in lb.pools:  # a page of slack + a decode step's worst-case excess while its snapshot is in flight
            assert GUARD <= p.pool.numel() - p.used < 2 * p.page_bytes() + GUARD
    sa, sb = exact.stats(), free.stats()
    assert {k: v for k, v in sa.items() if "allocated" not in k} == {k: v for k, v in sb.items() if "allocated" not in k}
    assert free.verify()["checksums"] == checksums
