"""CUDA reservations (gaac_hf/cache/reserve_cuda.py, the default; GAAC_RESERVE_CUDA=0 turns them off), marker gpu
(passed on an H100, session 21). The fixtures set the variable explicitly, so each test runs the path it names.
``MIN_GRANULES_CUDA`` is set to 0 so that every pool of the small random-weight SmolLM2-shaped model lives in a
reservation from its first growth.

* a span maps granules as rows are added: the address never changes, old rows are kept, rows handed out
  again read zero, the mapped bytes are counted and given back when the last view dies;
* ``generate()`` with reserved pools (formats 4 and 2) is bit-identical (tokens, logits) to the same run
  with pools that grow by copying, and no reserved pool moved during decode;
* decode steps that grow reserved pools never sync the host.
"""
from __future__ import annotations

import gc

import pytest
import torch
from test_cache import attention, same_bits
from test_cache_gpu import _prompt, model_table  # noqa: F401 - the module fixture

from gaac_hf.cache import GAACCache, reserve
from gaac_hf.models import cache_kwargs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def reserved(monkeypatch):
    monkeypatch.setenv("GAAC_RESERVE_CUDA", "1")
    monkeypatch.setattr(reserve, "MIN_GRANULES_CUDA", 0)
    if not reserve.enabled(torch.device("cuda")):
        pytest.skip("the driver's VMM calls are not available")


def test_span_maps_granules_in_place_and_gives_them_back(reserved):
    from gaac_hf.cache import reserve_cuda

    gran = reserve_cuda.granularity(torch.cuda.current_device())
    before = reserve_cuda.mapped_bytes()
    t = reserve.grow_or_copy(torch.zeros(0, 1024, dtype=torch.uint8, device="cuda"), 1)
    assert reserve.is_reserved(t)
    ptr = t.data_ptr()
    vals = torch.randint(0, 256, (3 * gran // 1024 + 5, 1024), dtype=torch.uint8, device="cuda")
    t = reserve.grow(t, vals.shape[0])
    t.copy_(vals)
    for rows in (vals.shape[0] + 1, 20 * gran // 1024 + 3):
        t = reserve.grow(t, rows)
        assert t.data_ptr() == ptr and t.shape[0] == rows
        assert torch.equal(t[: vals.shape[0]], vals) and not t[vals.shape[0]:].any()
    assert reserve_cuda.mapped_bytes() - before == reserve.held_bytes(t) >= t.numel()
    assert reserve.held_bytes(t) % gran == 0
    t.fill_(255)  # rows handed out again (a shorter view grown back) read zero
    short = reserve._view(t.untyped_storage(), [vals.shape[0], 1024], torch.uint8)
    again = reserve.grow(short, vals.shape[0] + 100)
    assert again.data_ptr() == ptr and not again[vals.shape[0]:].any() and bool((again[: vals.shape[0]] == 255).all())
    del t, short, again
    gc.collect()
    torch.cuda.synchronize()
    assert reserve_cuda.mapped_bytes() == before


def _pools(cache):
    return [(i, k, p) for i, layer in enumerate(cache.layers) for k, p in enumerate(layer.pools)]


def _tensors(pool):
    return [getattr(pool, n) for n in ("pool", "slots", "esc_start", "heap", "raw") if isinstance(getattr(pool, n, None), torch.Tensor)]


@pytest.mark.parametrize("fmt", [4, 2])
def test_generate_with_reserved_pools_is_bit_identical(model_table, monkeypatch, fmt):
    if fmt == 4 and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("format 4 serves Hopper")
    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 150, seed=7).items()}
    kw = dict(do_sample=False, max_new_tokens=40, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    outs, caches = {}, {}
    for on in (False, True):
        monkeypatch.setenv("GAAC_RESERVE_CUDA", "1" if on else "0")
        monkeypatch.setattr(reserve, "MIN_GRANULES_CUDA", 0)
        cache = caches[on] = GAACCache(model.config, calibration=table, format_version=fmt)
        with torch.no_grad(), attention(model, "gaac"):
            outs[on] = model.generate(**inputs, **cache_kwargs(model.generate, cache), **kw)
    assert torch.equal(outs[False].sequences, outs[True].sequences)
    for a, b in zip(outs[False].logits, outs[True].logits):
        assert same_bits(a, b)
    assert any(reserve.is_reserved(t) for _, _, p in _pools(caches[True]) for t in _tensors(p))
    assert not any(reserve.is_reserved(t) for _, _, p in _pools(caches[False]) for t in _tensors(p))
    for la, lb in zip(caches[False].layers, caches[True].layers):
        ka, va = la.full_kv()
        kb, vb = lb.full_kv()
        assert same_bits(ka, kb) and same_bits(va, vb)


def test_reserved_pools_never_move_and_decode_steps_never_sync(model_table, reserved):
    model, table = model_table
    ids = torch.randint(100, 49000, (2, 300), device="cuda")
    cache = GAACCache(model.config, calibration=table)
    with torch.no_grad(), attention(model, "gaac"):
        tok = model(input_ids=ids, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        addr = {(i, k): [t.data_ptr() for t in _tensors(p)] for i, k, p in _pools(cache)}
        held = sum(p.allocated_bytes() for _, _, p in _pools(cache))
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(200):  # past several page growths of every pool (block size 16)
                tok = model(input_ids=tok, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    moved = [(key, n) for (i, k, p) in _pools(cache) for key in [(i, k)]
             for n, (t, a) in enumerate(zip(_tensors(p), addr[key])) if reserve.is_reserved(t) and t.data_ptr() != a]
    assert not moved
    assert sum(p.allocated_bytes() for _, _, p in _pools(cache)) >= held and cache.verify()["slot_rows"] > 0
