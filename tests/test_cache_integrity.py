"""Corruption is caught, never silently decoded (mutation-style, CPU).

Each test flips bits in one kind of stored data of a live cache (data planes, tag plane, escape
streams, stream offsets, raw rows) and checks that a decode raises (the structural checks every CPU
decode runs) or ``cache.verify()`` does (the structural checks, plus the per-block checksums of
``GAACCache(checksums=True)``). An untouched cache verifies clean and decodes to the exact bits.
Format v2 storage (its planes, heap and offsets); format v3's corruption tests are in tests/test_cache_v3.py.
"""
import pytest
import torch

from conftest import synthetic_cache
from gaac_hf.codec.escapes import escape_lengths

T, H, D, L = 16, 2, 64, 2


def _cache(checksums=True):
    gen = torch.Generator().manual_seed(5)
    cache = synthetic_cache(L, H, D, T, return_full_kv=True, checksums=checksums, format_version=2)
    k = torch.randn(1, H, 6 * T + 3, D, generator=gen)
    k[0, 0, T : 2 * T] = 2.0 ** torch.randint(-90, 90, (T, D), generator=gen).float()  # block 1 of head 0: raw
    v = torch.randn(1, H, 6 * T + 3, D, generator=gen)
    kv = [k.to(torch.bfloat16), v.to(torch.bfloat16)]
    for layer in cache.layers:
        layer.update(*kv)
        layer._recent = None
    return cache, kv


def _same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_an_untouched_cache_verifies_and_decodes_exactly():
    cache, kv = _cache()
    got = cache.verify()
    assert got["checksums"] and got["slot_rows"] > 0 and got["raw_rows"] == L  # one raw K block per layer
    for layer in cache.layers:
        k, v = layer.full_kv()
        assert _same(k, kv[0]) and _same(v, kv[1])
    assert cache.stats()["raw_fallback_blocks"] == L


def _pool(cache):
    p = cache.layers[1].pools[0]  # layer 1, K: has escape streams and a raw row
    assert p.n_heap > 0 and p.n_raw == 1
    return p


def _detected(cache, decode_too: bool):
    with pytest.raises(ValueError, match="corrupt GAAC cache") as e:
        cache.verify()
    assert "layer 1 K" in str(e.value)
    if decode_too:  # the structural checks of the live decode path catch it without checksums
        with pytest.raises(ValueError, match="corrupt GAAC cache"):
            cache.layers[1].full_kv()
    return str(e.value)


@pytest.mark.parametrize("byte", [0, 100, 700])
def test_a_flipped_data_plane_bit_fails_the_checksum(byte):
    cache, _ = _cache()
    p = _pool(cache)
    g = cache.geometry
    assert byte < g.tag_offset
    p.slots[3, byte] ^= 1 << (byte % 8)
    assert "checksum mismatch in slot rows [3]" in _detected(cache, decode_too=False)


def test_a_flipped_tag_bit_is_caught_by_the_decode_path_and_verify():
    cache, _ = _cache()
    p = _pool(cache)
    g = cache.geometry
    for bit in range(8):  # every bit of a tag byte changes a stream length (or makes a reserved tag)
        c, _ = _cache(checksums=False)
        q = _pool(c)
        q.slots[2, g.tag_offset] ^= 1 << bit
        msg = _detected(c, decode_too=True)
        assert "impossible escape-stream length" in msg or "reserved mode tag" in msg
    p.slots[2, g.tag_offset] |= 0b11  # group 0 of row 2: the reserved tag 3
    assert "reserved mode tag 3" in _detected(cache, decode_too=True)


def test_a_flipped_escape_stream_bit_fails_the_checksum():
    cache, _ = _cache()
    p = _pool(cache)
    row = int((escape_lengths(p.slots[: p.n_slots], cache.geometry) > 0).nonzero()[0])
    p.heap[int(p.esc_start[row])] ^= 0x10
    assert f"checksum mismatch in slot rows [{row}]" in _detected(cache, decode_too=False)


@pytest.mark.parametrize("delta", [1, -1, 1 << 20])
def test_a_moved_stream_offset_is_caught_by_the_decode_path(delta):
    cache, _ = _cache(checksums=False)
    p = _pool(cache)
    row = int((escape_lengths(p.slots[: p.n_slots], cache.geometry) > 0).nonzero()[0])
    p.esc_start[row] += delta
    assert "impossible escape-stream length or offset" in _detected(cache, decode_too=True)


def test_a_flipped_raw_row_bit_fails_the_checksum():
    cache, _ = _cache()
    p = _pool(cache)
    p.raw.view(torch.uint8)[0, 3, 7] ^= 0x80
    assert "checksum mismatch in raw rows [0]" in _detected(cache, decode_too=False)


def test_a_block_table_entry_past_the_pools_is_caught():
    cache, _ = _cache()
    cache.layers[1].tables[0][0, 1, 0] = 10_000
    assert "past the pools" in _detected(cache, decode_too=False)
