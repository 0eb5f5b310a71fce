"""Host-side shortcuts of the decode step, checked on the CPU (no model weights needed).

* ``GAACLayer.append`` builds no ``torch.cat`` in a step that completes no block, and ``full()`` then
  reads the tail in place: still the exact bits of every token written;
* ``paged_kv()``'s ``num_blocks`` / ``tail_len`` tensors are shared by the layers of a cache and
  stay right through crop / reorder / batch selection;
* a prefill stores each layer's blocks at the next layer's append (no host sync inside a layer);
* the attention launcher's reused scratch and lazy ``LAST_LAUNCH`` give the same results.
"""
import dataclasses

import pytest
import torch

import gaac_hf.kernels.triton.attention as A
import gaac_hf.kernels.triton.pack as P
from gaac_hf import GAACCache
from gaac_hf.format import BlockGeometry
from gaac_hf.kernels import LaunchConfig
from conftest import synthetic_cache

T, H, D, L = 16, 2, 64, 2


def _cache(layers=L, heads=H):
    return synthetic_cache(layers, heads, D, T, return_full_kv=False, format_version=2)


def _kv(gen, b, q, heads=H):
    return [torch.randn(b, heads, q, D, generator=gen).to(torch.bfloat16) for _ in range(2)]


def _step(cache, ks, vs, gen, b, q):
    """One update of every layer (what the attention call does after it: clear the carrier state)."""
    k, v = _kv(gen, b, q)
    ks.append(k)
    vs.append(v)
    for layer in cache.layers:
        layer.update(k, v)
    return k, v


def _consume(cache):
    for layer in cache.layers:
        layer._awaiting_attention, layer._recent = False, None


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_append_without_block_completion_builds_no_cat(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    cache = _cache()
    ks, vs = [], []
    _step(cache, ks, vs, gen, 2, 2 * T + 3)  # prefill: 2 blocks + 3 tail tokens
    _consume(cache)
    cats = []
    real_cat = torch.cat

    def counting_cat(*a, **k):
        cats.append(1)
        return real_cat(*a, **k)

    for q in [1] * (T - 4) + [1, 1, 5, 2 * T + 1, 1]:  # plain steps, a fill, a multi-token step, two fills at once
        layer = cache.layers[0]
        completes = layer.tail_len + q >= T
        nb0 = layer.num_blocks
        monkeypatch.setattr(torch, "cat", counting_cat)
        _step(cache, ks, vs, gen, 2, q)
        monkeypatch.setattr(torch, "cat", real_cat)
        if completes:
            assert len(cats) == 2 * L  # one per kind and layer: the blocks to encode
            assert all(lay._recent is not None and lay._recent[0] == nb0 for lay in cache.layers)
        else:
            assert cats == [], "a step that completes no block concatenated on the cache path"
            assert all(lay._recent is None for lay in cache.layers)
        cats.clear()
        want_k, want_v = real_cat(ks, dim=2), real_cat(vs, dim=2)
        for layer in cache.layers:  # what this step's attention reads: exact bits, old blocks + tail
            got_k, got_v = layer.full_kv()
            assert _same(got_k, want_k) and _same(got_v, want_v)
        _consume(cache)
        for layer in cache.layers:  # and after the step (everything read from slots + tail)
            got_k, got_v = layer.full_kv()
            assert _same(got_k, want_k) and _same(got_v, want_v)


def test_paged_kv_counts_shared_and_follow_the_cache():
    gen = torch.Generator().manual_seed(1)
    cache = _cache(layers=3)
    ks, vs = [], []
    _step(cache, ks, vs, gen, 3, 3 * T + 5)
    _consume(cache)

    def check():
        views = [layer.paged_kv() for layer in cache.layers]
        first = views[0]
        for layer, view in zip(cache.layers, views):
            b = layer.tails[0].shape[0]
            assert view.num_blocks.tolist() == [layer.num_blocks] * b
            assert view.tail_len.tolist() == [layer.tail_len] * b
            assert view.num_blocks.dtype == view.tail_len.dtype == torch.int32
            assert view.num_blocks is first.num_blocks and view.tail_len is first.tail_len  # one pair per step
        return first

    v0 = check()
    _step(cache, ks, vs, gen, 3, 1)
    _consume(cache)
    v1 = check()
    assert v1.tail_len is not v0.tail_len and v1.tail_len.tolist() == [6] * 3
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    check()
    cache.crop(-8)  # into the last encoded block: 2 blocks + 14 tail tokens
    assert check().num_blocks.tolist() == [2] * 3
    cache.batch_select_indices(torch.tensor([0, 2]))
    assert check().tail_len.tolist() == [14] * 2
    cache.batch_repeat_interleave(2)
    assert check().num_blocks.tolist() == [2] * 4
    cache.reset()
    _step(cache, [], [], gen, 1, T + 1)
    assert check().num_blocks.tolist() == [1]


def test_decoder_row_scratch_is_reused_and_grown():
    """The fast decoders' row-offset scratch (kernels.decode._row_scratch) is one buffer per device and
    stream: a smaller call reuses it, a larger one grows it, and the bits are those of the data.

    The growth is exercised with a planted undersized buffer (the floor is 4,096 rows, which a decode
    only outgrows past 256 blocks of 16 tokens: minutes in the Triton interpreter), so a decode that
    needs more rows than the buffer holds really runs on the grown one; the size rule past the floor
    is checked on the allocator itself."""
    import gaac_hf.kernels.triton.decode as Dk
    from gaac_hf.codec import encode_blocks, pack_escapes
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (conftest.py)
    geom = BlockGeometry(block_size=16, head_dim=64)
    x = synthetic_kv((1, 1, 16 * 12, 64), "k", seed=3, device=dev)[0, 0].reshape(12, 16, 64)
    b8, b16 = calibrate(x.reshape(1, 1, -1, 64))
    b8, b16 = b8[0], b16[0]
    enc = encode_blocks(x, b8, b16, geom)
    assert bool(enc.fits.all())
    heap, start = pack_escapes(enc.escapes, enc.escape_len)
    Dk._ROW_SCRATCH.clear()
    small = Dk.decode_blocks_triton(enc.slots[:2], (heap, start[:2]), b8, b16, geom, fast=True)
    assert len(Dk._ROW_SCRATCH) == 1
    key, buf = next(iter(Dk._ROW_SCRATCH.items()))
    assert buf.numel() == 4096  # the floor: 2 blocks x 16 rows need 32
    again = Dk.decode_blocks_triton(enc.slots[:2], (heap, start[:2]), b8, b16, geom, fast=True)
    assert Dk._ROW_SCRATCH[key] is buf
    planted = Dk._ROW_SCRATCH[key] = torch.full((32,), -1, dtype=torch.int16, device=buf.device)  # 2 blocks' worth
    big = Dk.decode_blocks_triton(enc.slots, (heap, start), b8, b16, geom, fast=True)  # 12 x 16 rows > 32
    grown = Dk._ROW_SCRATCH[key]
    assert len(Dk._ROW_SCRATCH) == 1 and grown is not planted and grown.numel() >= 12 * 16
    assert Dk._row_scratch(300 * 16, buf.device).numel() == 300 * 16  # past the floor: exactly what is asked
    assert Dk._row_scratch(100, buf.device).numel() == 300 * 16  # and then reused by smaller calls
    bits = x.view(torch.int16)
    assert torch.equal(small.view(torch.int16), bits[:2]) and torch.equal(again.view(torch.int16), bits[:2])
    assert torch.equal(big.view(torch.int16), bits)


def test_launcher_scratch_reuse_and_last_launch():
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (conftest.py)
    geom = BlockGeometry(block_size=16, head_dim=64)
    lens = [40, 21]
    k = synthetic_kv((2, 1, 40, 64), "k", seed=5, device=dev)
    v = synthetic_kv((2, 1, 40, 64), "v", seed=6, device=dev)
    (kb8, kb16), (vb8, vb16) = calibrate(k), calibrate(v)
    pk = P.pack_paged_kv(k, lens, kb8, kb16, geom)
    pv = P.pack_paged_kv(v, lens, vb8, vb16, geom)
    kv = P.paged_kv(pk, pv)
    q = torch.randn(2, 2, 64, generator=torch.Generator().manual_seed(7)).to(dev, torch.bfloat16)

    def run(splits):
        return A.gaac_decode_attention(q, kv, launch=LaunchConfig(num_splits=splits))

    A._SCRATCH.clear()
    fresh = {s: run(s) for s in (1, 2)}  # first call per split count: fresh scratch
    last = dict(A.LAST_LAUNCH)
    assert set(last) == {"splits", "blocks_per_split", "n_regs", "n_spills"}
    assert (last["splits"], last["blocks_per_split"]) == (2, 2)  # blocks [0, 2] (2 + tail) in 2 splits
    assert len(A._SCRATCH) == 1
    entry = next(iter(A._SCRATCH.values()))
    assert _same(run(2), fresh[2])
    assert next(iter(A._SCRATCH.values())) is entry  # same split count: buffers reused, not reallocated
    for s in (1, 2, 2, 1):  # resized between calls: same bits as with fresh buffers
        assert _same(run(s), fresh[s])
    with pytest.raises(ValueError, match="contiguous"):
        bad_tail = dataclasses.replace(kv.k, tail=kv.k.tail.transpose(2, 3).contiguous().transpose(2, 3))
        A.gaac_decode_attention(q, dataclasses.replace(kv, k=bad_tail))


def test_prefill_reads_the_counters_of_k_and_v_in_one_sync(monkeypatch):
    """A prefill must size the raw pool and escape heap from exact device counts (a host sync); K and
    V of a layer share that one read, and decode steps inside the headroom read nothing."""
    import gaac_hf.cache.pool as C

    class CountingTorch:
        def __init__(self):
            self.stacked = []

        def __getattr__(self, name):
            return getattr(torch, name)

        def stack(self, tensors, *a, **k):
            self.stacked.append(len(tensors))
            return torch.stack(tensors, *a, **k)

    proxy = CountingTorch()
    monkeypatch.setattr(C, "torch", proxy)
    monkeypatch.setattr(C, "_keeps_headroom", lambda device: True)  # the CUDA policy, on the CPU
    gen = torch.Generator().manual_seed(3)
    cache = _cache()
    ks, vs = [], []
    _step(cache, ks, vs, gen, 2, 3 * T + 1)  # prefill: every layer syncs once, for K and V together
    assert proxy.stacked == [8] * L
    _consume(cache)
    proxy.stacked.clear()
    for _ in range(T):  # one block per row and head completes on the way: inside the headroom
        _step(cache, ks, vs, gen, 2, 1)
        _consume(cache)
    assert proxy.stacked == []
    assert all(layer.num_blocks == 4 for layer in cache.layers)
    k, v = cache.layers[0].full_kv()
    assert _same(k, torch.cat(ks, 2)) and _same(v, torch.cat(vs, 2))


def test_kv_start_memo_follows_the_mask():
    """The per-step kv_start memo of the fused path: same mask -> same tensor; an in-place edit or
    another mask -> recomputed (a stale left-padding offset would silently change attention)."""
    from gaac_hf.cache.attention import _kv_start

    m = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    m[0, ..., :2] = False
    a = _kv_start(m)
    assert a.tolist() == [2, 0] and _kv_start(m) is a
    m[1, ..., :3] = False  # in place: the version counter moves
    assert _kv_start(m).tolist() == [2, 3]
    other = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    assert _kv_start(other).tolist() == [0, 0]


def test_prefill_store_waits_for_the_next_layer(monkeypatch):
    """A prefill parks each layer's encoded blocks and stores them at the next layer's append (on CUDA
    the sizes arrive by a non-blocking copy meanwhile: no sync inside the layer); every public read
    (tables, pools, stats, full_kv, paged_kv, crop) stores a parked append first, reset drops it."""
    import gaac_hf.cache as C

    order = []
    real_store = C.GAACLayer._store_deferred
    real_update = C.GAACLayer.update

    def store(self, *a):
        order.append(("store", self.layer_idx))
        return real_store(self, *a)

    def update(self, *a, **k):
        order.append(("update", self.layer_idx))
        return real_update(self, *a, **k)

    monkeypatch.setattr(C.GAACLayer, "_store_deferred", store)
    monkeypatch.setattr(C.GAACLayer, "update", update)
    gen = torch.Generator().manual_seed(5)
    cache = _cache(layers=3)
    ks, vs = [], []
    _step(cache, ks, vs, gen, 2, 3 * T + 5)
    assert order == [("update", 0), ("update", 1), ("store", 0), ("update", 2), ("store", 1)]
    last = cache.layers[2]
    assert last._deferred.pending is not None and last._deferred.pending[0] is last
    assert last.num_blocks == 3  # host counts are current; the tables are not stored yet
    order.clear()
    tables = last.tables  # a public read stores it
    assert order == [("store", 2)] and last._deferred.pending is None
    assert bool((tables[0][:, :, :3] >= 0).all())
    _consume(cache)
    for layer in cache.layers:
        k, v = layer.full_kv()
        assert _same(k, torch.cat(ks, 2)) and _same(v, torch.cat(vs, 2))
    # every other public read flushes too
    for read in (lambda c: c.stats(), lambda c: c.layers[2].full_kv(), lambda c: c.layers[2].paged_kv(),
                 lambda c: c.layers[2].pools, lambda c: c.crop(-1)):
        c2 = _cache(layers=3)
        _step(c2, [], [], torch.Generator().manual_seed(5), 2, 3 * T + 5)
        _consume(c2)
        assert c2.layers[2]._deferred.pending is not None
        read(c2)
        assert c2.layers[2]._deferred.pending is None
    # reset drops a parked append of its own layer
    c3 = _cache(layers=3)
    _step(c3, [], [], torch.Generator().manual_seed(5), 2, 3 * T + 5)
    c3.layers[2].reset()
    assert c3.layers[2]._deferred.pending is None


def test_host_slab_hands_out_disjoint_slices(monkeypatch):
    """The per-cache pinned slab (CUDA only; pinning stubbed out here): slices never overlap, a full
    slab is replaced by a new one, and a cache makes its slab big enough for all its layers."""
    import gaac_hf.cache as C
    import gaac_hf.cache.host as H

    made = []

    class NoPinTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

        def zeros(self, *a, pin_memory=False, **k):
            t = torch.zeros(*a, **k)
            made.append(t)
            return t

    monkeypatch.setattr(H, "torch", NoPinTorch())
    slab = H._HostSlab(12)
    parts = [slab.take(2), slab.take(2), slab.take(8)]
    assert len(made) == 1 and [p.numel() for p in parts] == [2, 2, 8]
    ptrs = [p.data_ptr() for p in parts]
    assert ptrs == sorted(set(ptrs)) and ptrs[1] - ptrs[0] == 16 and ptrs[2] - ptrs[1] == 16
    for i, p in enumerate(parts):
        p.fill_(i + 1)
    assert made[0].tolist() == [1, 1, 2, 2] + [3] * 8
    extra = slab.take(2)  # full: a new slab, the old slices keep their memory
    assert len(made) == 2 and extra.data_ptr() == made[1].data_ptr() and parts[2].tolist() == [3] * 8
    assert H._HOST_SLOTS_PER_LAYER == 2 + 2 + 8  # K snapshot, V snapshot, deferred sync terms


def test_fused_option_is_checked_and_auto_declines_long_contexts(monkeypatch):
    """fused="auto" hands decode steps past gaac_hf.cache.attention.FUSED_MAX_TOKENS to the decode-then-SDPA
    path before anything touches a kernel; bad values are refused."""
    import gaac_hf.cache.attention as gattn

    with pytest.raises(ValueError, match="fused must be"):
        GAACCache(_cache().layers[0]._config, calibration=_cache().table, fused="yes")

    class Layer:
        fused = "auto"

        def __init__(self, n):
            self.n = n
            self.geometry = BlockGeometry(block_size=T, head_dim=D)

        def get_seq_length(self):
            return self.n

    monkeypatch.setattr(gattn, "_fused_kernel", lambda: (_ for _ in ()).throw(AssertionError("probed")))
    q = torch.zeros(1, 2, 1, D, dtype=torch.bfloat16)
    assert gattn._fused_decode(None, q, Layer(gattn.FUSED_MAX_TOKENS), None, 1.0) is None
    with pytest.raises(AssertionError, match="probed"):  # below the threshold it goes on to the kernel
        gattn._fused_decode(None, q, Layer(gattn.FUSED_MAX_TOKENS - 1), None, 1.0)


def test_auto_long_steps_leave_cudnn_out():
    """The decode-then-SDPA steps of fused="auto" run SDPA with every backend but cuDNN (its per-call
    host cost, see gaac_hf.cache.attention._no_cudnn); the setting is restored afterwards."""
    import gaac_hf.cache.attention as gattn

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with gattn._no_cudnn():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    # the user's own backend choices stand (only cuDNN is switched off), also when an error leaves
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with gattn._no_cudnn():
                assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
                raise RuntimeError("inside")
        assert torch.backends.cuda.cudnn_sdp_enabled() == before and not torch.backends.cuda.flash_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(False)  # already off: stays off
        with gattn._no_cudnn():
            pass
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_cudnn_sdp(before)
