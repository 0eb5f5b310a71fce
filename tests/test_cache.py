"""GAACCache + GAAC attention on real SmolLM2-135M weights (CPU, reference path).

The contract tested here: with the GAAC attention and a GAACCache, generate() produces the same tokens
and the same logits, bit for bit, as DynamicCache + sdpa, for every decoding strategy generate()
uses a cache for; the stored blocks decode to the exact K/V bits; a model whose attention is not
the GAAC one still gets exact results (update() returns full K/V); bad inputs fail loudly.

Block size 16 so that prompts of a few hundred tokens span many encoded blocks.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

import gaac_hf
from gaac_hf.cache.attention import gaac_attention_forward
from gaac_hf.cache import GAACCache, GAACLayer
from gaac_hf.calibration import (
    CalibrationTable,
    choose_windows,
    config_fingerprint,
    exponent_histogram,
    model_kv_shape,
)
from gaac_hf.codec import decode_blocks
from gaac_hf.format import BlockGeometry
from gaac_hf.models import cache_kwargs

pytestmark = pytest.mark.slow

BLOCK = 16


# ---------------------------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------------------------
def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (distinguishes -0/+0 and NaN payloads, unlike ==)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def kv_table(model, ids: torch.Tensor, geometry: BlockGeometry, name: str = "smollm2-test") -> CalibrationTable:
    """A calibration table from the model's own KV on ``ids`` (windows by histogram)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), use_cache=True)
    kv = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])  # [L, 2, H, S, D]
    base8, base16 = choose_windows(exponent_histogram(kv))
    meta = {"model_name": name, "kv_shape": model_kv_shape(model.config), "fingerprint": config_fingerprint(model.config)}
    return CalibrationTable(base8, base16, geometry, meta)


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` (undone by monkeypatch) by a wrapper that appends to the returned list on each call."""
    calls, real = [], getattr(owner, name)

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(owner, name, counting)
    return calls


@contextlib.contextmanager
def attention(model, name: str):
    """Temporarily switch the (session-shared) model's attention implementation."""
    old = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


@pytest.fixture(autouse=True)
def format_v2_default(monkeypatch):
    """This file checks format v2 (the CPU default until session 20, still the default on GPUs without a
    fused v3/v4 kernel): every cache a test here builds without ``format_version`` stores v2. The v3
    default on the CPU reruns the storage tests through tests/test_cache_v3.py, which calls these test
    functions with its own fixtures."""
    import gaac_hf.cache.layer as layer_mod

    monkeypatch.setattr(layer_mod, "default_format", lambda *a, **k: 2)


@pytest.fixture(scope="session")
def text_ids(model_tok, wikitext_test) -> torch.Tensor:
    """Held-out real text as token ids ``[1, N]``."""
    _, tok = model_tok
    return tok(wikitext_test[2000:40000], return_tensors="pt").input_ids


@pytest.fixture(scope="session")
def table(model_tok, wikitext_valid) -> CalibrationTable:
    """Calibrated on WikiText-2 validation text (not the held-out test text used for prompts)."""
    model, tok = model_tok
    calib = wikitext_valid[:20000]
    ids = tok(calib, return_tensors="pt").input_ids[:, :512]
    return kv_table(model, ids, BlockGeometry(block_size=BLOCK, head_dim=64))


def gen_kwargs(tok, **kw) -> dict:
    base = dict(do_sample=False, max_new_tokens=10, return_dict_in_generate=True, output_logits=True,
                cache_implementation=None, pad_token_id=tok.pad_token_id)
    return base | kw


def run_pair(model, table, inputs: dict, cache_kw: str | None = None, **kw):
    """generate() with DynamicCache + sdpa, then with GAACCache + gaac: (ref, out, gaac_cache). ``cache_kw``: the
    keyword GAACCache goes in by (default: the one this transformers names, :func:`gaac_hf.models.cache_keyword`)."""
    tok_kw = {k: v for k, v in kw.items() if k != "seed"}
    seed = kw.get("seed")
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        ref = model.generate(**inputs, **cache_kwargs(model.generate, DynamicCache(config=model.config)), **tok_kw)
    cache = GAACCache(model.config, calibration=table)
    if seed is not None:
        torch.manual_seed(seed)
    with attention(model, "gaac"), torch.no_grad():
        out = model.generate(**inputs, **({cache_kw: cache} if cache_kw else cache_kwargs(model.generate, cache)),
                             **tok_kw)
    return ref, out, cache


def prefill_both(model, table, ids: torch.Tensor):
    """One forward over ``ids`` into a DynamicCache (sdpa) and a GAACCache (gaac): (dyn, gaac)."""
    dyn = DynamicCache(config=model.config)
    gaac = GAACCache(model.config, calibration=table)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, dyn))
        with attention(model, "gaac"):
            model(ids, **cache_kwargs(model, gaac))
    return dyn, gaac


def assert_same_generation(ref, out) -> None:
    assert torch.equal(ref.sequences, out.sequences), (ref.sequences, out.sequences)
    assert len(ref.logits) == len(out.logits)
    for step, (a, b) in enumerate(zip(ref.logits, out.logits)):
        assert same_bits(a, b), f"logits differ at step {step}"


# ---------------------------------------------------------------------------------------------
# generate(): bit identity with DynamicCache + sdpa
# ---------------------------------------------------------------------------------------------
def test_greedy_many_blocks_bit_identical(model_tok, table, text_ids):
    model, tok = model_tok
    ids = text_ids[:, :140]  # 8 full blocks + 12 tail tokens; 10 new tokens cross a block boundary
    ref, out, cache = run_pair(model, table, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               **gen_kwargs(tok))
    assert_same_generation(ref, out)
    layer = cache.layers[0]
    assert isinstance(layer, GAACLayer)
    assert layer.num_blocks == (140 + 9) // BLOCK  # the last token generated is never fed back
    assert cache.get_seq_length() == 140 + 9
    st = cache.stats()
    assert st["tail_tokens"] == (140 + 9) % BLOCK and st["seq_length"] == 149


def test_cache_keyword(model_tok, table, text_ids):
    """Both spellings: ``cache=`` where the installed transformers takes it (>= 5.24; the other tests use it there),
    and ``past_key_values=``, which every supported release still accepts (deprecated from 5.24 on)."""
    model, tok = model_tok
    ids = text_ids[:, 300:345]
    spellings = ["past_key_values"] + (["cache"] if "cache" in inspect.signature(type(model).forward).parameters else [])
    for kw in spellings:
        with warnings.catch_warnings():  # the old spelling's FutureWarning (5.24+) is expected here
            warnings.simplefilter("ignore", FutureWarning)
            ref, out, cache = run_pair(model, table, {"input_ids": ids}, cache_kw=kw, **gen_kwargs(tok, max_new_tokens=6))
        assert_same_generation(ref, out)
        assert cache.get_seq_length() == 45 + 5  # GAACCache really was the one generate() used


def test_batch_left_padding(model_tok, table, wikitext_test):
    model, tok = model_tok
    tok.padding_side = "left"
    texts = [wikitext_test[5000:5400], wikitext_test[9000:9120], wikitext_test[12000:12600]]
    inputs = tok(texts, return_tensors="pt", padding=True)
    assert inputs.attention_mask[:, 0].tolist().count(0) == 2  # two rows really are padded
    ref, out, cache = run_pair(model, table, dict(inputs), **gen_kwargs(tok, max_new_tokens=8))
    assert_same_generation(ref, out)
    assert cache.layers[0].num_blocks >= 6


def test_sampling_fixed_seed(model_tok, table, text_ids):
    model, tok = model_tok
    ids = text_ids[:, 500:580]
    kw = gen_kwargs(tok, do_sample=True, temperature=0.9, top_k=40, top_p=0.95, max_new_tokens=10)
    ref, out, _ = run_pair(model, table, {"input_ids": ids}, seed=1234, **kw)
    assert_same_generation(ref, out)


def test_beam_search(model_tok, table, text_ids):
    model, tok = model_tok
    ids = text_ids[:, 700:790]  # 5 blocks + 10: the beams fill and finalize a block of their own
    kw = gen_kwargs(tok, num_beams=3, num_return_sequences=2, max_new_tokens=10, output_scores=True)
    ref, out, cache = run_pair(model, table, {"input_ids": ids}, **kw)
    assert torch.equal(ref.sequences, out.sequences)
    assert same_bits(ref.sequences_scores, out.sequences_scores)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)
    assert cache.layers[0].num_blocks == 6


def test_prompt_shorter_than_a_block(model_tok, table, text_ids):
    model, tok = model_tok
    ids = text_ids[:, 1000:1005]  # 5 tokens: prefill encodes nothing, decode fills the first block
    ref, out, cache = run_pair(model, table, {"input_ids": ids}, **gen_kwargs(tok, max_new_tokens=14))
    assert_same_generation(ref, out)
    assert cache.layers[0].num_blocks == 1 and cache.layers[0].tail_len == 2


def test_continue_from_existing_cache(model_tok, table, text_ids):
    """Second generate() on the same cache, with a multi-token continued prompt (q_len > 1) that
    attends over compressed history and itself completes blocks."""
    model, tok = model_tok
    first = text_ids[:, 1200:1260]
    extra = text_ids[:, 1400:1425]
    kw = gen_kwargs(tok, max_new_tokens=7)
    dyn = DynamicCache(config=model.config)
    gaac = GAACCache(model.config, calibration=table)
    with torch.no_grad():
        ref1 = model.generate(first, **cache_kwargs(model.generate, dyn), **kw)
        with attention(model, "gaac"):
            out1 = model.generate(first, **cache_kwargs(model.generate, gaac), **kw)
        assert_same_generation(ref1, out1)
        ids2 = torch.cat([ref1.sequences, extra], dim=1)
        ref2 = model.generate(ids2, **cache_kwargs(model.generate, dyn), **kw)
        with attention(model, "gaac"):
            out2 = model.generate(ids2, **cache_kwargs(model.generate, gaac), **kw)
    assert_same_generation(ref2, out2)
    assert gaac.get_seq_length() == dyn.get_seq_length()


def test_prompt_lookup_decoding_uses_crop(model_tok, table, text_ids):
    """Candidate-token decoding verifies several tokens at once and crops rejected ones out of the
    cache, sometimes back into encoded blocks."""
    model, tok = model_tok
    ids = torch.cat([text_ids[:, 2000:2060], text_ids[:, 2000:2030]], dim=1)  # repetitive: lookups hit
    kw = gen_kwargs(tok, max_new_tokens=16, prompt_lookup_num_tokens=6)
    ref, out, _ = run_pair(model, table, {"input_ids": ids}, **kw)
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)


# ---------------------------------------------------------------------------------------------
# forward-level: crop into encoded history, non-GAAC attention, stored bits
# ---------------------------------------------------------------------------------------------
def test_crop_into_encoded_block_then_continue(model_tok, table, text_ids):
    model, _ = model_tok
    ids = text_ids[:, 3000:3100]  # 6 blocks + 4
    more = text_ids[:, 3200:3205]
    dyn, gaac = prefill_both(model, table, ids)
    with torch.no_grad():
        dyn.crop(-14)  # 86 tokens: block 5 (80..95) was encoded, now 6 tokens of it go back to the tail
        gaac.crop(-14)
        layer = gaac.layers[3]
        assert (layer.num_blocks, layer.tail_len) == (5, 6)
        for kind, want in ((0, dyn.layers[3].keys), (1, dyn.layers[3].values)):
            assert same_bits(layer.full(kind), want)
        ref = model(more, **cache_kwargs(model, dyn)).logits
        with attention(model, "gaac"):
            out = model(more, **cache_kwargs(model, gaac)).logits
    assert same_bits(ref, out)


def test_non_gaac_attention_gets_full_kv(model_tok, table, text_ids):
    """sdpa (or any other attention) + GAACCache: update() returns full decompressed K/V."""
    model, tok = model_tok
    assert model.config._attn_implementation == "sdpa"
    ids = text_ids[:, 4000:4070]
    kw = gen_kwargs(tok, max_new_tokens=6)
    with torch.no_grad():
        ref = model.generate(ids, **cache_kwargs(model.generate, DynamicCache(config=model.config)), **kw)
        cache = GAACCache(model.config, calibration=table)
        out = model.generate(ids, **cache_kwargs(model.generate, cache), **kw)
    assert_same_generation(ref, out)
    assert cache.layers[0].num_blocks == 4  # compressed nonetheless
    k, v = cache.layers[0].update(torch.zeros(1, 3, 1, 64, dtype=torch.bfloat16),
                                  torch.zeros(1, 3, 1, 64, dtype=torch.bfloat16))
    assert k.shape[2] == cache.get_seq_length() and getattr(k, "_gaac_layer", None) is None


def test_tail_carrier_not_consumed_raises(model_tok, table):
    model, _ = model_tok
    cache = GAACCache(model.config, calibration=table, return_full_kv=False)
    x = torch.zeros(1, 3, 20, 64, dtype=torch.bfloat16)
    k, _ = cache.update(x, x, 0)
    assert k.shape[2] == 4 and k._gaac_layer is cache.layers[0]
    with pytest.raises(RuntimeError, match="bypassed"):
        cache.update(x, x, 0)


def test_stored_blocks_decode_to_dynamic_cache_bits(model_tok, table, text_ids):
    """Codec level: every table entry, decoded with the reference codec (or read from the raw
    pool), has the exact bits of DynamicCache's K/V."""
    model, _ = model_tok
    ids = text_ids[:, 5000:5150]
    dyn, gaac = prefill_both(model, table, ids)
    g = gaac.geometry
    nb = 150 // BLOCK
    raw_seen = 0
    for li, layer in enumerate(gaac.layers):
        for kind, want in ((0, dyn.layers[li].keys), (1, dyn.layers[li].values)):
            pool = layer.pools[kind]
            table_ = layer.tables[kind][0, :, :nb]  # [H, nb]
            b8, b16 = gaac.table.bases(li, kind)
            for h in range(table_.shape[0]):
                e = table_[h].long()
                fit = e >= 0
                got = torch.empty(nb, g.block_size, g.head_dim, dtype=torch.bfloat16)
                if fit.any():
                    got[fit] = decode_blocks(pool.slots[e[fit]], (pool.heap, pool.esc_start[e[fit]]), b8[h], b16[h], g)
                got[~fit] = pool.raw[-e[~fit] - 1]
                raw_seen += int((~fit).sum())
                exp = want[0, h, : nb * g.block_size].reshape(nb, g.block_size, g.head_dim)
                assert same_bits(got, exp), (li, kind, h)
            tail = layer.tails[kind][0, :, : layer.tail_len]
            assert same_bits(tail, want[0, :, nb * g.block_size :])
    assert raw_seen == gaac.stats()["raw_fallback_blocks"]


def test_stats_ratio_on_real_text(model_tok, table, text_ids):
    model, _ = model_tok
    ids = text_ids[:, 6000:6768]
    cache = GAACCache(model.config, calibration=table)
    with attention(model, "gaac"), torch.no_grad():
        model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
    st = cache.stats(per_layer=True)
    assert st["ratio"] >= 1.35, st
    assert st["bf16_bytes"] == 30 * 2 * 3 * 768 * 64 * 2
    assert abs(sum(st["mode_shares"].values()) - 1) < 1e-9
    assert st["mode_shares"]["3bit"] > 0.8
    assert st["tail_tokens"] == 0 and st["seq_length"] == 768
    assert st["stored_blocks"] == st["encoded_blocks"] == 30 * 2 * 3 * 768 // BLOCK
    assert len(st["layers"]) == 30


# ---------------------------------------------------------------------------------------------
# cache bookkeeping on synthetic KV (no model forward)
# ---------------------------------------------------------------------------------------------
def _windowed(table, kind: int, rows: int, tokens: int, gen: torch.Generator, wild: float,
              start: int = 0, raw_every: int = 0) -> torch.Tensor:
    """Synthetic bf16 ``[rows, 3, tokens, 64]`` K (kind 0) or V (1) inside layer 0's windows, except a
    fraction ``wild`` of values with arbitrary exponents (they push groups to 4-bit/raw). With
    ``raw_every = n``, kv-head 1 of every n-th block (by absolute position: the chunk starts at token
    ``start``) is wild throughout: all its groups are raw, its stream is past the escape limit, and the
    cache must store it as a raw fallback."""
    b8 = table.base8[0, kind].to(torch.int32)  # [H, D]
    exp = b8[None, :, None, :] + torch.randint(0, 8, (rows, 3, tokens, 64), generator=gen, dtype=torch.int32)
    wild_mask = torch.rand(rows, 3, tokens, 64, generator=gen) < wild
    if raw_every:
        pos = start + torch.arange(tokens)
        hit = (pos // BLOCK) % raw_every == raw_every - 1
        wild_mask[:, 1] |= hit[None, :, None]
    exp = torch.where(wild_mask, torch.randint(1, 255, exp.shape, generator=gen, dtype=torch.int32), exp)
    sm = torch.randint(0, 256, exp.shape, generator=gen, dtype=torch.int32)
    bits = ((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)
    return bits.to(torch.int16).view(torch.bfloat16)


def _filled(table, model, rows: int, tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = _windowed(table, 0, rows, tokens, g, wild=0.002, raw_every=2)
    v = _windowed(table, 1, rows, tokens, g, wild=0.005, raw_every=3)  # some raw-fallback blocks
    cache = GAACCache(model.config, calibration=table, return_full_kv=True)
    dyn = DynamicCache(config=model.config)
    cache.update(k, v, 0)
    dyn.update(k, v, 0)
    return cache, dyn


def _assert_layer0_equal(cache, dyn):
    k, v = cache.layers[0].full_kv()
    assert same_bits(k, dyn.layers[0].keys) and same_bits(v, dyn.layers[0].values)


SPECIAL_BITS = (0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F, 0x0080, 0x7F7F)


def _with_specials(x: torch.Tensor, gen: torch.Generator, share: float) -> torch.Tensor:
    """x with a fraction of values replaced by NaN payloads, +-Inf, +-0, subnormals and extremes."""
    bits = x.contiguous().view(torch.int16).clone()
    pick = torch.rand(bits.shape, generator=gen) < share
    vals = torch.tensor(SPECIAL_BITS, dtype=torch.int32).to(torch.int16)
    bits[pick] = vals[torch.randint(0, len(SPECIAL_BITS), (int(pick.sum()),), generator=gen)]
    return bits.view(torch.bfloat16)


@pytest.fixture(params=["reference", "triton"])
def codec_path(request, monkeypatch):
    """The cache's CPU path (reference codec), and its CUDA path (Triton encoder, escape append and
    block-table decoder) run on the CPU through Triton's interpreter."""
    if request.param == "triton":
        import gaac_hf.cache.pool as cache_mod

        monkeypatch.setattr(cache_mod, "_triton_codec", lambda geometry, device: cache_mod._triton_kernels(geometry))
    return request.param


def test_special_values_survive_the_cache_bit_for_bit(model_tok, table, codec_path):
    """Prefill + token-by-token decode with NaN/Inf/-0/subnormal K/V: blocks (compressed and raw
    fallback) and tail return exactly the bits DynamicCache holds (both codec paths)."""
    model, _ = model_tok
    g = torch.Generator().manual_seed(7)
    cache = GAACCache(model.config, calibration=table, return_full_kv=True)
    dyn = DynamicCache(config=model.config)
    pos = 0
    # prefill (4 blocks + tail), a token, a chunk completing 2 blocks, a token; every step after the
    # prefill decodes the earlier blocks. Sparse specials (0.05%) keep the prefill's blocks compressed,
    # dense ones (2%) in the token and the chunk make blocks 4-5 special-heavy (raw fallbacks).
    # Each step checks what update() returns (what attention reads: blocks of earlier steps decoded
    # from their slots, this step's from its input); the read after the loop decodes every block.
    for tokens, share in ((70, 0.0005), (1, 0.02), (30, 0.02), (1, 0.0005)):
        k = _with_specials(_windowed(table, 0, 2, tokens, g, 0.002, start=pos, raw_every=4), g, share)
        v = _with_specials(_windowed(table, 1, 2, tokens, g, 0.002), g, share)
        pos += tokens
        got = cache.update(k, v, 0)
        want = dyn.update(k, v, 0)
        assert all(same_bits(a, b) for a, b in zip(got, want))
    _assert_layer0_equal(cache, dyn)
    layer = cache.layers[0]
    assert layer.num_blocks > 0
    assert layer.pools[0].triton == (codec_path == "triton")
    t = layer.geometry.block_size
    for kind in (0, 1):  # DynamicCache's K/V: the bits the cache was just checked to return (no second decode)
        full = (dyn.layers[0].keys, dyn.layers[0].values)[kind]
        blocks = full[:, :, : layer.num_blocks * t].unflatten(2, (layer.num_blocks, t)).float()
        in_slot = layer.tables[kind][:, :, : layer.num_blocks] >= 0  # [B, H, blocks]: compressed, not raw
        special = (torch.isnan(blocks) | torch.isinf(blocks) | (blocks == 0)).flatten(3).any(-1)
        assert (special & in_slot).any(), "no special value went through an encoded slot"
        assert (special & ~in_slot).any() or not (~in_slot).any()


def test_reorder_select_repeat_match_dynamic_cache(model_tok, table):
    model, _ = model_tok
    cache, dyn = _filled(table, model, rows=3, tokens=77)
    layer = cache.layers[0]
    for op, arg in (("reorder_cache", torch.tensor([2, 2, 0])), ("batch_repeat_interleave", 2),
                    ("batch_select_indices", torch.tensor([0, 3, 5]))):
        getattr(cache, op)(arg)
        getattr(dyn, op)(arg)
        _assert_layer0_equal(cache, dyn)
        if op == "batch_select_indices":  # compacted: every pool row left is referenced by some row
            for kind in (0, 1):
                live = layer.tables[kind][:, :, : layer.num_blocks]
                assert layer.pools[kind].n_slots + layer.pools[kind].n_raw == torch.unique(live).numel()
        g = torch.Generator().manual_seed(1)
        rows = cache.layers[0].tails[0].shape[0]
        k, v = _windowed(table, 0, rows, 9, g, 0.002), _windowed(table, 1, rows, 9, g, 0.005)
        cache.update(k, v, 0)
        dyn.update(k, v, 0)
        _assert_layer0_equal(cache, dyn)
    for kind in (0, 1):
        pool = layer.pools[kind]
        assert pool.n_slots > 0 and pool.n_raw > 0  # both storage kinds exercised
    st = cache.stats()
    assert st["stored_blocks"] == sum(torch.unique(tb[:, :, : layer.num_blocks]).numel() for tb in layer.tables)


def test_from_dynamic_cache(model_tok, table):
    model, _ = model_tok
    _, dyn = _filled(table, model, rows=2, tokens=50)
    cache = GAACCache.from_dynamic_cache(dyn, model.config, table)
    _assert_layer0_equal(cache, dyn)
    assert cache.layers[0].num_blocks == 3 and cache.layers[1].get_seq_length() == 0


def test_crop_positive_and_to_zero(model_tok, table):
    """Negative crop everywhere; positive crop = "keep n tokens" before transformers 5.18, an error after."""
    model, _ = model_tok
    cache, dyn = _filled(table, model, rows=2, tokens=70)
    cache.crop(-9)  # 61 = 3 blocks + 13: block 3 goes back to the tail
    dyn.layers[0].crop(-9)
    _assert_layer0_equal(cache, dyn)
    if gaac_hf.cache.compat.POSITIVE_CROP_IS_LENGTH:
        cache.crop(30)
        dyn.layers[0].crop(30)
        _assert_layer0_equal(cache, dyn)
    else:
        with pytest.raises(ValueError, match="positive"):
            cache.crop(30)
        cache.crop(-31)
    assert cache.get_seq_length() == 30
    cache.crop(-100)
    assert cache.get_seq_length() == 0
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.stats()["resident_bytes"] == 0


# ---------------------------------------------------------------------------------------------
# registration and errors
# ---------------------------------------------------------------------------------------------
def test_register_is_idempotent_and_undoable():
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    name = "gaac_test_name"
    assert name not in AttentionInterface._global_mapping
    gaac_hf.register(name)
    gaac_hf.register(name)
    assert AttentionInterface._global_mapping[name] is gaac_attention_forward
    assert AttentionMaskInterface._global_mapping[name] is sdpa_mask
    gaac_hf.unregister(name)
    gaac_hf.unregister(name)
    assert name not in AttentionInterface._global_mapping and name not in AttentionMaskInterface._global_mapping
    with pytest.raises(ValueError):
        gaac_hf.register("my_sdpa")


def test_shipped_table_by_repo_relative_path(model_tok, text_ids, tmp_path, monkeypatch):
    """The constructor users guess, from any working directory, with the table shipped in the repo."""
    model, _ = model_tok
    monkeypatch.chdir(tmp_path)
    cache = GAACCache(model.config, calibration="calibration_data/smollm2-135m.safetensors")
    assert cache.geometry.block_size == 64
    by_name = GAACCache(model.config, calibration="smollm2-135m")  # the shipped name, as the README writes it
    assert torch.equal(by_name.table.base8, cache.table.base8) and torch.equal(by_name.table.base16, cache.table.base16)
    with pytest.raises(FileNotFoundError, match="shipped: 'smollm2-135m-fp8_e4m3', 'smollm2-135m-fp8_e5m2', 'smollm2-135m'"):
        GAACCache(model.config, calibration="smollm2-1b")
    with attention(model, "gaac"), torch.no_grad():
        model(text_ids[:, 8000:8140], **cache_kwargs(model, cache), logits_to_keep=1)
    st = cache.stats()
    assert st["encoded_blocks"] == 30 * 2 * 3 * 2 and st["tail_tokens"] == 12 and st["raw_fallback_blocks"] <= 2


def test_table_for_another_model_is_rejected(model_tok, table):
    model, _ = model_tok
    other = copy.deepcopy(model.config)
    other.num_hidden_layers = 12
    other.layer_types = other.layer_types[:12] if getattr(other, "layer_types", None) else None
    with pytest.raises(ValueError, match="does not fit"):
        GAACCache(other, calibration=table)
    with pytest.raises(ValueError, match="calibration"):
        GAACCache(model.config)


def test_non_bf16_model_is_rejected(table):
    from transformers import LlamaConfig, LlamaForCausalLM

    gaac_hf.register()
    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, attn_implementation="gaac")
    torch.manual_seed(0)
    tiny = LlamaForCausalLM(cfg).eval()  # float32
    ids = torch.randint(0, 64, (1, 40))
    with torch.no_grad():
        t = kv_table(tiny.to(torch.bfloat16), ids, BlockGeometry(BLOCK, 64), name="tiny")
        tiny.to(torch.float32)
        with pytest.raises(ValueError, match="bfloat16"):
            tiny(ids, **cache_kwargs(tiny, GAACCache(tiny.config, calibration=t)))


def test_mask_shape_mismatch_is_an_error(model_tok, table):
    model, _ = model_tok
    cache = GAACCache(model.config, calibration=table, return_full_kv=False)
    x = torch.zeros(1, 3, 20, 64, dtype=torch.bfloat16)
    k, v = cache.update(x, x, 0)
    attn = model.model.layers[0].self_attn
    q = torch.zeros(1, 9, 1, 64, dtype=torch.bfloat16)
    bad = torch.ones(1, 1, 1, 25, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask covers 25"):
        gaac_attention_forward(attn, q, k, v, bad, scaling=0.125)
    out, _ = gaac_attention_forward(attn, q, k, v, torch.ones(1, 1, 1, 20, dtype=torch.bool), scaling=0.125)
    assert out.shape == (1, 1, 9, 64)


def test_hybrid_sliding_window_model_keeps_stock_sliding_layers():
    """Gemma3-style hybrid (random tiny weights): sliding layers stay stock DynamicSlidingWindowLayer,
    full layers are GAAC; generation with left padding past the window is bit-identical."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.cache_utils import DynamicSlidingWindowLayer

    gaac_hf.register()
    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64, sliding_window=24,
                           layer_types=["sliding_attention", "full_attention"] * 2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).to(torch.bfloat16).eval()
    table = kv_table(model, torch.randint(0, 128, (1, 20)), BlockGeometry(BLOCK, 64), name="tiny-gemma3")
    ids = torch.randint(0, 128, (2, 60))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    ref, out, cache = run_pair(model, table, {"input_ids": ids, "attention_mask": mask},
                               **gen_kwargs(SimpleNamespace(pad_token_id=0), max_new_tokens=12))
    assert_same_generation(ref, out)
    kinds = [type(layer) for layer in cache.layers]
    assert kinds == [DynamicSlidingWindowLayer, GAACLayer] * 2
    assert cache.get_seq_length() == 71 and cache.stats()["stock_layer_bytes"] > 0
