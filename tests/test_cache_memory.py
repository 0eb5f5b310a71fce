"""Memory that is really saved: what a GAACCache allocates, against what it holds and against DynamicCache.

* The allocation bound of ``docs/CACHE.md`` "Memory" (allocated - resident < one page per pool and
  table plus the BF16 tail), checked after every step of a synthetic walk with crop and batch
  selection, and the bits still exact.
* Real SmolLM2 K/V fed token by token (prefills of 1, 256 and 1,024): allocated bytes never above
  DynamicCache's from 128 tokens on, and <= 0.75x of them from 1,024 (default run, to 1,280
  tokens) / from 4,096 (the ``full`` run, to 8,192 tokens).
* Peak tensor bytes of ``generate()`` with GAACCache below DynamicCache's on the CPU.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from transformers import DynamicCache

import gaac_hf
from gaac_hf import GAACCache
from gaac_hf.cache import reserve
from gaac_hf.cache.layer import TABLE_PAGE
from gaac_hf.cache.memory import TensorBytesMeter, dynamic_cache_bytes, walk_allocation
from gaac_hf.cache.pool import CPU_HEAP_PAGE
from conftest import first_layers_cache, synthetic_cache
from gaac_hf.models import cache_kwargs

T, H, D, L = 16, 2, 64, 2


def _synthetic_cache(checksums=False):
    return synthetic_cache(L, H, D, T, return_full_kv=True, checksums=checksums, format_version=2)


def _bound(cache) -> int:
    """docs/CACHE.md "Memory", CPU: per GAAC layer and kind, one heap page (+ its sink byte), one table
    page and T tail tokens; slot rows and raw rows are allocated exactly on the CPU; each of the pool's
    growing tensors (slots, escape offsets, heap, raw rows, and both checksum columns when kept) lies in
    a reservation whose last page is counted whole."""
    out = 0
    for layer in cache.layers:
        b, h = layer.tails[0].shape[:2]
        grown = 4 + 2 * (layer.pools[0].sums is not None)
        out += 2 * (CPU_HEAP_PAGE + 1 + TABLE_PAGE * b * h * 4 + b * h * T * D * 2 + grown * reserve.PAGE)
    return out


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("checksums", [False, True])
def test_allocation_stays_within_one_page_per_pool_plus_the_tail(checksums):
    gen = torch.Generator().manual_seed(3)
    cache = _synthetic_cache(checksums)
    b = 3
    ks, vs = [], []

    def step(q):
        k, v = (torch.randn(b, H, q, D, generator=gen).to(torch.bfloat16) for _ in range(2))
        ks.append(k)
        vs.append(v)
        for layer in cache.layers:
            layer.update(k, v)

    def check():
        st = cache.stats()
        assert st["resident_bytes"] <= st["allocated_bytes"] <= st["resident_bytes"] + _bound(cache), st
        for layer in cache.layers:
            for p in layer.pools:  # CPU: slot rows, esc_start and raw rows exactly as many as held
                assert p.slots.shape[0] == p.esc_start.shape[0] == p.n_slots
                assert p.raw.shape[0] == p.n_raw
                if checksums:
                    assert p.sums.shape[0] == p.n_slots and p.raw_sums.shape[0] == p.n_raw
        assert st["allocated_vs_bf16"] == pytest.approx(st["allocated_bytes"] / st["bf16_bytes"])
        assert st["resident_vs_bf16"] == pytest.approx(st["resident_bytes"] / st["bf16_bytes"])

    step(12 * T + 5)  # a prefill of 12 blocks: no headroom past the bound
    check()
    for q in [1] * (2 * T) + [5, 2 * T + 1]:
        step(q)
        check()
    want = [torch.cat(ks, dim=2), torch.cat(vs, dim=2)]
    cache.crop(-(T + 3))  # into an encoded block
    want = [w[:, :, : -(T + 3)] for w in want]
    check()
    cache.batch_select_indices(torch.tensor([0, 2]))
    want = [w[[0, 2]] for w in want]
    check()
    for layer in cache.layers:
        got = layer.full_kv()
        assert _same(got[0], want[0]) and _same(got[1], want[1])
    assert cache.verify()["checksums"] == checksums


def test_a_short_prompt_allocates_about_what_it_holds():
    """24 tokens (below one block of 64 in SmolLM2's table) used to allocate 2.31 MB for 0.55 MB."""
    cache = synthetic_cache(L, H, D, 64, format_version=2)
    kv = [tuple(torch.randn(1, H, 24, D).to(torch.bfloat16) for _ in range(2)) for _ in range(L)]
    rows = walk_allocation(cache, kv, 24, 24)
    # the tail grows in quarter blocks: 32 token positions for 24 tokens; plus the 1-byte heap sinks
    # and the one-column block tables
    assert rows[-1]["allocated_bytes"] == dynamic_cache_bytes(kv, 24) * 32 // 24 + 2 * L * (1 + H * 4)
    assert rows[-1]["resident_bytes"] == rows[-1]["dynamic_bytes"]


# ---------------------------------------------------------------------------------------------
# real SmolLM2 K/V


@pytest.fixture(scope="module")
def smollm2_kv(smollm2, wikitext_test):
    """A function (layers, tokens) -> the real K/V of SmolLM2's first ``layers`` layers on WikiText."""
    model, tok = smollm2
    ids = tok(wikitext_test, return_tensors="pt").input_ids

    def get(layers: int, tokens: int):
        assert ids.shape[1] >= tokens, "WikiText-2 test is long enough for 8K tokens"
        dyn = first_layers_cache(model, ids[:, :tokens], layers)
        return [(layer.keys, layer.values) for layer in dyn.layers]

    return get


def _walk_and_check(model, kv, stop: int, from_075: int):
    for prefill in (1, 256, 1024):
        if prefill >= stop:
            continue
        cache = GAACCache(model.config, calibration="smollm2-135m")
        with warnings.catch_warnings():  # the shipped table fits its own model: no fitness warning
            warnings.filterwarnings("error", message="GAACCache: the calibration table")
            rows = walk_allocation(cache, kv, prefill, stop)
        assert cache.layers[0]._fitness.done
        assert [r["tokens"] for r in rows] == list(range(prefill, stop + 1))
        over = [r for r in rows if r["tokens"] >= 128 and r["allocated_bytes"] > r["dynamic_bytes"]]
        assert not over, f"prefill {prefill}: allocated above DynamicCache at {over[:3]}"
        high = [r for r in rows if r["tokens"] >= from_075 and r["allocated_bytes"] > 0.75 * r["dynamic_bytes"]]
        assert not high, f"prefill {prefill}: allocated above 0.75x DynamicCache at {high[:3]}"
        last = rows[-1]
        assert last["resident_bytes"] <= last["allocated_bytes"] < 0.73 * last["dynamic_bytes"]
        # the real K/V come back bit for bit from pools that grew in place (reservations, on the CPU by default)
        if reserve.enabled(torch.device("cpu")):
            assert any(reserve.is_reserved(p.pool if hasattr(p, "pool") else p.slots)
                       for layer in cache.layers[: len(kv)] for p in layer.pools)
        for layer, (k, v) in zip(cache.layers, kv):
            got_k, got_v = layer.full_kv()
            assert _same(got_k, k[:, :, :stop]) and _same(got_v, v[:, :, :stop])


@pytest.mark.slow
def test_real_kv_allocation_below_dynamic_cache_to_1280_tokens(smollm2, smollm2_kv):
    """Layers 0-2 of SmolLM2 (per-layer bytes do not depend on the other layers): ~1 min on 2 cores."""
    _walk_and_check(smollm2[0], smollm2_kv(3, 1280), 1280, from_075=1024)


@pytest.mark.full
def test_real_kv_allocation_below_dynamic_cache_to_8192_tokens(smollm2, smollm2_kv):
    """The must-show walk: 1 to 8,192 tokens, layers 0-5 (``eval/memory_report.py`` runs all 30)."""
    _walk_and_check(smollm2[0], smollm2_kv(6, 8192), 8192, from_075=4096)


@pytest.mark.slow
def test_generate_peak_tensor_bytes_below_dynamic_cache(smollm2, wikitext_test, stock_bf16_linear):
    model, tok = smollm2
    ids = tok(wikitext_test, return_tensors="pt").input_ids[:, :1024]
    kw = dict(max_new_tokens=2, do_sample=False, cache_implementation=None)
    gaac_hf.register()
    impl = model.config._attn_implementation
    peaks, outs = {}, {}
    try:
        for name in ("dynamic", "gaac"):
            model.set_attn_implementation("gaac" if name == "gaac" else "sdpa")
            cache = (GAACCache(model.config, calibration="smollm2-135m") if name == "gaac"
                     else DynamicCache(config=model.config))
            with torch.no_grad(), TensorBytesMeter() as meter:
                outs[name] = model.generate(ids, **cache_kwargs(model.generate, cache), **kw)
            peaks[name] = meter.peak_bytes
            del cache
    finally:
        model.set_attn_implementation(impl)
    assert torch.equal(outs["gaac"], outs["dynamic"])
    assert peaks["dynamic"] > 20e6  # the meter saw the KV (1024 tokens: 23.6 MB in BF16)
    assert peaks["gaac"] < peaks["dynamic"], peaks
