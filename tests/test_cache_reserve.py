"""Pools that grow without copying (gaac_hf.cache.reserve): CPU pool tensors past ``MIN_BYTES`` live in a
reservation and every later growth re-views more of it; nothing moves, nothing is copied, bits stay exact.

* the module itself: in-place growth keeps addresses and rows, new rows read zero (also rows handed out
  before), page-rounded held bytes, deepcopy clones without copying the span, ``GAAC_RESERVE=0``;
* a cache walk token by token (formats 2, 3 and FP8): once a pool is reserved its storage address never
  changes again, decoded K/V (with NaN, +-Inf, -0 and subnormals among them) equal the input bit for bit, ``stats()["allocated_bytes"]`` counts the
  page-rounded views, and ``copy.deepcopy`` of the cache stays independent and exact;
* ``TensorBytesMeter`` counts reservation pages (they are not storages an op returns).
"""
from __future__ import annotations

import copy
import io

import pytest
import torch

from gaac_hf.cache import reserve
from gaac_hf.cache.memory import TensorBytesMeter
from conftest import synthetic_cache

pytestmark = pytest.mark.skipif(not reserve.enabled(torch.device("cpu")), reason="reservations need Linux")


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_growth_in_place_keeps_rows_and_addresses_and_new_rows_are_zero():
    rows = reserve.MIN_BYTES // 64
    t = reserve.grow_or_copy(torch.zeros(0, 32, dtype=torch.bfloat16), rows)
    assert reserve.is_reserved(t) and t.shape == (rows, 32) and not t.any()
    ptr = t.data_ptr()
    vals = torch.randn(rows, 32).to(torch.bfloat16)
    t.copy_(vals)
    for n in (rows + 1, 3 * rows, 40 * rows):
        t = reserve.grow_or_copy(t, n)
        assert t.data_ptr() == ptr and t.shape == (n, 32)
        assert _same(t[:rows], vals) and not t[rows:].any()
    # rows handed out before (a shorter view made by hand) read zero when handed out again
    t[rows:].fill_(1.0)
    short = reserve._view(t.untyped_storage(), [rows, 32], t.dtype)
    again = reserve.grow(short, 2 * rows)
    assert again.data_ptr() == ptr and _same(again[:rows], vals) and not again[rows:].any()


def test_small_tensors_stay_ordinary_and_held_bytes_round_to_the_page():
    small = reserve.grow_or_copy(torch.zeros(1, dtype=torch.uint8), 100)
    assert not reserve.is_reserved(small) and reserve.held_bytes(small) == 100
    big = reserve.grow_or_copy(small, reserve.MIN_BYTES + 1)
    assert reserve.is_reserved(big) and reserve.held_bytes(big) == reserve.MIN_BYTES + reserve.PAGE
    assert big[0] == 0 and reserve.grow(torch.zeros(reserve.MIN_BYTES, dtype=torch.uint8), 10 ** 6) is None


class Holder(reserve.DeepcopyReserved):
    pass


def test_deepcopy_clones_the_rows_not_the_span():
    h = Holder()
    h.t = reserve.grow_or_copy(torch.zeros(0, dtype=torch.int64), reserve.MIN_BYTES)
    h.t.copy_(torch.arange(h.t.numel()))
    h.meta = {"n": 3}
    before = reserve.committed_bytes()
    c = copy.deepcopy(h)
    assert reserve.committed_bytes() - before == reserve.held_bytes(h.t)  # one view's pages, not the span
    assert reserve.is_reserved(c.t) and c.t.data_ptr() != h.t.data_ptr() and torch.equal(c.t, h.t)
    assert c.meta == h.meta and c.meta is not h.meta
    c.t[0] = -1
    assert h.t[0] == 0
    buf = io.BytesIO()
    torch.save(h, buf)  # the rows only: a view's storage would be the whole span
    assert buf.tell() < 2 * h.t.numel() * 8 + 4096
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert torch.equal(back.t, h.t) and back.meta == h.meta


def test_gaac_reserve_0_turns_reservations_off(monkeypatch):
    monkeypatch.setenv("GAAC_RESERVE", "0")
    assert not reserve.enabled(torch.device("cpu"))
    cache = synthetic_cache(1, 2, 64, 16)
    k = torch.randn(1, 2, 40 * 16, 64).to(torch.bfloat16)
    cache.layers[0].update(k, k)
    assert not any(reserve.is_reserved(t) for _, t in _pool_tensors(cache.layers[0]))


def _pool_tensors(layer):
    """(name, tensor) of every growing tensor of a layer's pools, whatever the format."""
    out = []
    for i, p in enumerate(layer.pools if hasattr(layer, "pools") else layer._pools):
        for name in ("slots", "esc_start", "heap", "raw", "pool"):
            if isinstance(getattr(p, name, None), torch.Tensor):
                out.append((f"{i}.{name}", getattr(p, name)))
    return out


@pytest.mark.parametrize("kind", ["v2", "v3", "fp8"])
def test_a_cache_walk_never_moves_a_reserved_pool_and_stays_exact(kind):
    T, H, D = 16, 2, 64
    if kind == "fp8":
        from test_cache_fp8 import synthetic_table, tiny_config

        from gaac_hf import GAACCache

        cache = GAACCache(tiny_config(), calibration=synthetic_table("fp8_e4m3"), kv_dtype="fp8_e4m3")
    else:
        cache = synthetic_cache(1, H, D, T, format_version=3 if kind == "v3" else 2)
    layer = cache.layers[0]
    gen = torch.Generator().manual_seed(0)
    ks, vs = [], []
    addr: dict[str, int] = {}
    moved_after_reserved = []
    reserved_seen = set()
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -1e-40, 3e38],
                            dtype=torch.bfloat16).view(torch.int16)  # NaN, +-Inf, -0, subnormals, near max
    for step in range(1 + 24 * T):
        q = 8 * T + 3 if step == 0 else 1
        k, v = (torch.randn(2, H, q, D, generator=gen).to(torch.bfloat16) for _ in range(2))
        if kind != "fp8":  # sparse special values (the FP8 conversion is not this test's subject)
            for x in (k, v):
                flat = x.view(torch.int16).view(-1)
                at = torch.randint(0, flat.numel(), (max(1, flat.numel() // 500),), generator=gen)
                flat[at] = specials[torch.randint(0, specials.numel(), at.shape, generator=gen)]
        ks.append(k)
        vs.append(v)
        ko, vo = layer.update(k, v)
        for name, t in _pool_tensors(layer):
            if name in addr and name in reserved_seen and t.data_ptr() != addr[name]:
                moved_after_reserved.append((step, name))
            addr[name] = t.data_ptr()
            if reserve.is_reserved(t):
                reserved_seen.add(name)
    assert reserved_seen, "the walk grows some pool past MIN_BYTES"
    assert not moved_after_reserved
    if kind != "fp8":  # FP8 returns dequantized codes: its own test compares codes
        assert _same(ko, torch.cat(ks, 2)) and _same(vo, torch.cat(vs, 2))  # int16 views: NaN payloads, -0 too
    st = cache.stats()
    held = sum(reserve.held_bytes(t) for _, t in _pool_tensors(layer))
    assert held <= st["allocated_bytes"]
    twin = copy.deepcopy(cache)
    k, v = (torch.randn(2, H, 1, D, generator=gen).to(torch.bfloat16) for _ in range(2))
    a = twin.layers[0].update(k, v)
    b = layer.update(k, v)
    assert all(_same(x, y) for x, y in zip(a, b))
    assert all(x.data_ptr() != y.data_ptr() for (_, x), (_, y) in zip(_pool_tensors(twin.layers[0]), _pool_tensors(layer))
               if x.numel())


def test_tensor_bytes_meter_counts_reservation_pages():
    with TensorBytesMeter() as m:
        t = reserve.grow_or_copy(torch.zeros(0, dtype=torch.uint8), 64 * reserve.PAGE)
        t.fill_(1)
    assert m.peak_bytes >= 64 * reserve.PAGE
