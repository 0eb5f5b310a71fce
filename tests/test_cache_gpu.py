"""GAACCache on CUDA: the reference path stays bit-identical to DynamicCache + sdpa there too, and the
fused Triton decode path is wired correctly (used for q_len == 1, close to SDPA, left padding).

The GPU machine has no real checkpoint, so the model is SmolLM2-135M-shaped with random weights and
its calibration table comes from its own KV (compression does not matter here, wiring does).
"""
from __future__ import annotations

import pytest
import torch
from test_cache import attention, kv_table, same_bits
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import gaac_hf
import gaac_hf.cache.attention as gattn
from gaac_hf.cache import GAACCache
from gaac_hf.codec import decode_blocks
from gaac_hf.format import BlockGeometry
from gaac_hf.models import cache_kwargs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model_table():
    gaac_hf.register()
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                      tie_word_embeddings=True, max_position_embeddings=8192, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(100, 49000, (1, 512), device="cuda")
    table = kv_table(model, ids, BlockGeometry(16, 64), name="random-smollm2-shape")
    return model, table.to("cpu")


def _prompt(rows: int, length: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, 49000, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    for r in range(1, rows):  # left padding of different lengths
        mask[r, : 7 * r] = 0
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda()}


def test_reference_path_on_cuda_is_bit_identical(model_table):
    model, table = model_table
    inputs = _prompt(2, 100, 0)
    kw = dict(do_sample=False, max_new_tokens=8, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(**inputs, **cache_kwargs(model.generate, DynamicCache(config=model.config)), **kw)
        with attention(model, "gaac"):
            out = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, fused=False, format_version=2)), **kw)
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)


def test_prefill_and_decode_step_never_sync_the_host(model_table):
    """A host sync inside a layer drains the GPU queue (the GPU then waits for the host's launches):
    copying the calibration bases to the GPU layer by layer cost 4 syncs per layer, ~+3% of a 32K
    prefill on the H200 (lab/NOTES.md). torch's sync debug mode raises on any synchronizing call."""
    model, table = model_table
    assert table.base8.device.type == "cpu"  # as users load it
    ids = torch.randint(100, 49000, (1, 300), device="cuda")
    cache = GAACCache(model.config, calibration=table, format_version=2)
    with torch.no_grad(), attention(model, "gaac"):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = model(input_ids=ids, **cache_kwargs(model, cache), logits_to_keep=1)
            nxt = out.logits[:, -1:].argmax(-1)
            model(input_ids=nxt, **cache_kwargs(model, cache), logits_to_keep=1)  # a decode step (fused kernel)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert cache.get_seq_length() == 301
    assert cache.layers[0].num_blocks == 300 // 16


def test_triton_codec_slots_decode_with_the_reference_codec(model_table):
    """On CUDA the pools are written by the Triton encoder; the reference decoder reads them back to
    DynamicCache's exact bits, and both codecs give bit-identical generate() results."""
    model, table = model_table
    inputs = _prompt(2, 100, 2)
    dyn = DynamicCache(config=model.config)
    cache = GAACCache(model.config, calibration=table, fused=False, format_version=2)
    with torch.no_grad():
        model(**inputs, **cache_kwargs(model, dyn))
        with attention(model, "gaac"):
            model(**inputs, **cache_kwargs(model, cache))
    g = cache.geometry
    for li in (0, 17, 29):
        layer = cache.layers[li]
        for kind, want in ((0, dyn.layers[li].keys), (1, dyn.layers[li].values)):
            pool = layer.pools[kind]
            assert pool.triton
            e = layer.tables[kind][:, :, : layer.num_blocks].reshape(-1).long()
            heads = torch.arange(3, device="cuda").view(1, 3, 1).expand(2, 3, layer.num_blocks).reshape(-1)
            b8, b16 = pool.base8[heads], pool.base16[heads]
            s = e.clamp(min=0)
            got = decode_blocks(pool.slots[s], (pool.heap, pool.esc_start[s]), b8, b16, g, validate=False)
            got = torch.where((e < 0)[:, None, None], pool.raw[(-e - 1).clamp(min=0)], got)
            exp = want[:, :, : layer.num_blocks * g.block_size].reshape(-1, g.block_size, g.head_dim)
            assert same_bits(got, exp)
    kw = dict(do_sample=False, max_new_tokens=6, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad(), attention(model, "gaac"):
        a = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, fused=False, format_version=2)), **kw)
        b = model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, fused=False, format_version=2,
                                                               triton_codec=False)), **kw)
    assert torch.equal(a.sequences, b.sequences) and all(same_bits(x, y) for x, y in zip(a.logits, b.logits))


def test_fused_decode_is_used_and_close_to_sdpa(model_table, monkeypatch):
    if gattn._fused_kernel() is None:
        pytest.skip("gaac_hf.kernels.attention is not importable here")
    model, table = model_table
    inputs = _prompt(3, 90, 1)
    calls = []
    real = gattn._fused_decode

    def counting(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(gattn, "_fused_decode", counting)
    cache = GAACCache(model.config, calibration=table, format_version=2)
    with torch.no_grad(), attention(model, "gaac"):
        model(**inputs, **cache_kwargs(model, cache))  # prefill: reference path (q_len > 1)
        assert calls == []
        layer = cache.layers[5]
        attn = model.model.layers[5].self_attn
        q = torch.randn(3, 9, 1, 64, device="cuda").to(torch.bfloat16)
        mask = inputs["attention_mask"].bool()[:, None, None, :]  # [B, 1, 1, kv] left padding
        k, v = layer.full_kv()
        ref, _ = gattn._sdpa()(attn, q, k, v, mask, scaling=attn.scaling)
        fused = gattn._fused_decode(attn, q, layer, mask, attn.scaling)
    assert fused is not None and calls == [True]
    assert fused.shape == ref.shape == (3, 1, 9, 64)
    torch.testing.assert_close(fused.float(), ref.float(), atol=2e-2, rtol=2e-2)

    # one generate() step after prefill runs the fused kernel in every layer
    calls.clear()
    with torch.no_grad(), attention(model, "gaac"):
        model.generate(**inputs, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table, format_version=2)), max_new_tokens=3,
                       do_sample=False, cache_implementation=None, pad_token_id=0)
    assert len(calls) == 2 * 30 and all(calls)


@pytest.mark.parametrize("checksums", [False, True])
def test_decode_finalize_without_host_sync(model_table, checksums):
    """After a prefill, single-token appends that complete blocks (some of them raw fallbacks) never
    wait for the GPU (checksums included), everything stored reads back to the exact input bits and
    verifies, and the allocation stays within the CUDA bound of docs/CACHE.md "Memory"."""
    from test_cache import _windowed

    from gaac_hf.cache.layer import TABLE_PAGE

    model, table = model_table
    g = torch.Generator().manual_seed(3)
    cache = GAACCache(model.config, calibration=table, checksums=checksums, format_version=2)
    layer = cache.layers[0]
    ks, vs = [], []

    def push(k, v):
        ks.append(k)
        vs.append(v)
        layer.append(k, v)

    push(_windowed(table, 0, 2, 64, g, 0.002).cuda(), _windowed(table, 1, 2, 64, g, 0.004).cuda())  # prefill
    steps = [(_windowed(table, 0, 2, 1, g, 0.002).cuda(),
              _windowed(table, 1, 2, 1, g, 0.05, start=64 + i, raw_every=2).cuda())  # raw fallbacks on the way
             for i in range(40)]  # 2.5 blocks of decode steps
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the debug mode does catch a host sync
            int(steps[0][0].float().sum())
        for k, v in steps:
            push(k, v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert layer.num_blocks == 6 and layer.tail_len == 8
    k, v = layer.full_kv()
    assert same_bits(k, torch.cat(ks, 2)) and same_bits(v, torch.cat(vs, 2))
    st = cache.stats()
    assert st["raw_fallback_blocks"] > 0 and st["stored_blocks"] == 2 * 2 * 3 * 6
    assert cache.verify()["checksums"] == checksums
    geo, (b, h) = cache.geometry, layer.tails[0].shape[:2]
    cs = 8 * checksums
    bound = sum(p.slot_page() * (geo.slot_bytes + 8 + cs) + p.heap_spare() + 1 + p.raw_spare() * (geo.raw_bytes + cs)
                + TABLE_PAGE * b * h * 4 + b * h * geo.block_size * geo.head_dim * 2 for p in layer.pools)
    assert st["resident_bytes"] <= st["allocated_bytes"] <= st["resident_bytes"] + bound


def test_auto_takes_decode_then_sdpa_past_the_threshold(model_table, monkeypatch):
    """fused="auto": from FUSED_MAX_TOKENS cached tokens on, decode steps decode K/V through the block
    tables (decode_tables_triton) and run the stock SDPA: no fused launch, and generate() is
    bit-identical to DynamicCache + sdpa (tokens and every step's logits)."""
    model, table = model_table
    monkeypatch.setattr(gattn, "FUSED_MAX_TOKENS", 64)
    kern = gattn._fused_kernel()
    if kern is not None:
        def refuse(*a, **k):
            raise AssertionError("the fused kernel ran past FUSED_MAX_TOKENS")
        monkeypatch.setattr(kern, "gaac_decode_attention", refuse)
    inputs = _prompt(2, 100, 5)
    kw = dict(do_sample=False, max_new_tokens=6, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad(), gattn._no_cudnn():  # the backend set "auto"'s long steps use, for both
        ref = model.generate(**inputs, **cache_kwargs(model.generate, DynamicCache(config=model.config)), **kw)
        with attention(model, "gaac"):
            cache = GAACCache(model.config, calibration=table, fused="auto", format_version=2)
            out = model.generate(**inputs, **cache_kwargs(model.generate, cache), **kw)
    assert cache.layers[0].fused == "auto" and cache.layers[0].pools[0].triton
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)
