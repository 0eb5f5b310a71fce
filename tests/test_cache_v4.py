"""GAACCache storing format v4 (``format_version=4``) on real SmolLM2-135M (CPU).

The storage contract of ``tests/test_cache.py`` (greedy over many blocks, beam search, crop into encoded
blocks, prompt lookup, batch ops, the hybrid sliding-window model) runs again with every cache storing v4
and attention taking SDPA on the decoded K/V: tokens and logits bit-identical to DynamicCache + sdpa,
stored blocks bit-exact. The pool's placement without host syncs (the CUDA path) runs here on the CPU too.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import gaac_hf.cache.layer as layer_mod
import gaac_hf.cache.pool_v3 as pool_v3
import tests.test_cache as tc
from gaac_hf.cache import GAACCache
from gaac_hf.cache.pool_v4 import _BlockPoolV4
from gaac_hf.codec.v4 import decode_pool_v4

pytestmark = pytest.mark.slow

text_ids, table = tc.text_ids, tc.table  # model_tok: conftest


@pytest.fixture
def v4(monkeypatch):
    """Every GAACCache built in the test stores v4."""
    monkeypatch.setattr(layer_mod, "default_format", lambda *a, **k: 4)


FULL = pytest.mark.full
STORAGE_TESTS = [
    "test_greedy_many_blocks_bit_identical", "test_beam_search", "test_crop_into_encoded_block_then_continue",
    "test_hybrid_sliding_window_model_keeps_stock_sliding_layers",
    pytest.param("test_prompt_lookup_decoding_uses_crop", marks=FULL), pytest.param("test_from_dynamic_cache", marks=FULL),
    pytest.param("test_batch_left_padding", marks=FULL), pytest.param("test_crop_positive_and_to_zero", marks=FULL),
]


@pytest.mark.parametrize("name", STORAGE_TESTS)
def test_v4_storage_passes_the_cache_tests(name, v4, request):
    fn = getattr(tc, name)
    fn(**{p: request.getfixturevalue(p) for p in inspect.signature(fn).parameters})


@pytest.mark.parametrize("sync_free", [False, True])
def test_v4_stored_blocks_decode_to_dynamic_cache_bits(model_tok, table, text_ids, monkeypatch, sync_free):
    """Every table entry, decoded by the reference codec from the pool, has DynamicCache's bits; the
    sync-free placement (device counter, the CUDA path) stores the same bytes as the exact one."""
    monkeypatch.setattr(layer_mod, "default_format", lambda *a, **k: 4)
    monkeypatch.setattr(pool_v3, "CPU_SYNC_FREE", sync_free)
    import gaac_hf.cache.pool_v4 as pool_v4

    monkeypatch.setattr(pool_v4, "CPU_SYNC_FREE", sync_free)
    model, _ = model_tok
    dyn, gaac = tc.prefill_both(model, table, text_ids[:, 5000:5150])
    nb, t = 150 // tc.BLOCK, tc.BLOCK
    layer = gaac.layers[0]
    assert layer.format_version == 4 and isinstance(layer.pools[0], _BlockPoolV4)
    assert layer.pools[0].sync_free == sync_free
    st = gaac.stats()
    assert st["format_version"] == 4 and st["ratio"] > 1.2, st
    for li in (0, 7, 29):
        layer = gaac.layers[li]
        for kind, want in ((0, dyn.layers[li].keys), (1, dyn.layers[li].values)):
            pool = layer.pools[kind]
            e = layer.tables[kind][0, :, :nb].reshape(-1)
            assert bool((e % 16 <= 1).all())
            heads = torch.arange(3).repeat_interleave(nb)
            got = decode_pool_v4(pool.pool, e, pool.base16[heads], layer.geometry, pool.kind)
            assert tc.same_bits(got, want[0, :, : nb * t].reshape(3 * nb, t, -1)), (li, kind)
            assert tc.same_bits(layer.tails[kind][0, :, : layer.tail_len], want[0, :, nb * t:])
    assert gaac.verify()["slot_rows"] > 0


def test_v4_corruption_is_caught(model_tok, table, text_ids, v4):
    model, _ = model_tok
    _, gaac = tc.prefill_both(model, table, text_ids[:, :100])
    pool = gaac.layers[3].pools[1]
    e = int(gaac.layers[3].tables[1][0, 0, 0])
    assert e & 1 == 0
    pool.pool[e + pool.geometry.side_offset] = 9  # n_raw of tile 0 > 3: structurally impossible
    with pytest.raises(ValueError, match="layer 3 V"):
        gaac.verify()


def test_v4_refuses_what_it_cannot_lay_out(model_tok, table):
    from types import SimpleNamespace

    from gaac_hf.cache.pool_v4 import geometry_v4
    from gaac_hf.format import BlockGeometry

    with pytest.raises(ValueError, match="format_version=4 takes head_dim"):
        geometry_v4(SimpleNamespace(block_size=64, head_dim=80, group_axis="channel"))  # e.g. Phi-2
    with pytest.raises(ValueError, match="groups along channels only"):
        geometry_v4(SimpleNamespace(block_size=64, head_dim=64, group_axis="token"))
    assert geometry_v4(BlockGeometry(block_size=16, head_dim=64)).block_bytes == 24 * 64 + 32  # one tile
    model, _ = model_tok
    with pytest.raises(ValueError, match="format_version must be"):
        GAACCache(model.config, calibration=table, format_version=5)
