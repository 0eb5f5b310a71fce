"""gaac_hf/cache/reserve_cuda.py's bookkeeping on the CPU, against a fake driver (no GPU needed).

The driver calls are replaced by a recorder that keeps the address space and mappings as the real VMM
API defines them (reserve, create, map at a granule-aligned offset, set access, unmap, free) and refuses
what the driver would refuse (mapping over a mapped range, freeing a range that is still mapped). Checked:
what ``ensure`` maps (granules, map-ahead, never past the span), that a failed ``cuMemSetAccess`` leaves
no stray mapping, that a dead span's range is freed only after its event completes and never while a
CUDA graph is being captured, and the mapped-bytes count. The GPU run of the same code is
``tests/test_cache_reserve_gpu.py``.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from gaac_hf.cache import reserve_cuda as rc

GRAN = 2 << 20


class FakeDriver:
    def __init__(self):
        self.next_va = 1 << 40
        self.ranges = {}      # va -> size
        self.maps = []        # [va, size]
        self.fail_access = False
        self.calls = []

    def cuMemAddressReserve(self, ptr, size, align, addr, flags):
        ptr._obj.value = self.next_va
        self.ranges[self.next_va] = size
        self.next_va += size + GRAN
        return 0

    def cuMemCreate(self, handle, size, prop, flags):
        assert size % GRAN == 0
        handle._obj.value = 7
        self.calls.append(("create", size))
        return 0

    def cuMemMap(self, va, size, offset, handle, flags):
        assert va % GRAN == 0 and size % GRAN == 0
        if any(a < va + size and va < a + s for a, s in self.maps):
            return 1  # CUDA_ERROR_INVALID_VALUE: already mapped
        self.maps.append([va, size])
        return 0

    def cuMemRelease(self, handle):
        return 0

    def cuMemSetAccess(self, va, size, desc, count):
        return 999 if self.fail_access else 0

    def cuMemUnmap(self, va, size):
        inside = [m for m in self.maps if va <= m[0] and m[0] + m[1] <= va + size]
        self.maps = [m for m in self.maps if m not in inside]
        return 0

    def cuMemAddressFree(self, va, size):
        assert not any(va <= m[0] < va + size for m in self.maps), "freeing a range that is still mapped"
        del self.ranges[va]
        return 0


class FakeEvent:
    done = False

    def record(self):
        pass

    def query(self):
        return FakeEvent.done


@pytest.fixture
def driver(monkeypatch):
    d = FakeDriver()
    monkeypatch.setattr(rc, "_libcuda", lambda: d)
    monkeypatch.setattr(rc, "granularity", lambda index: GRAN)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(rc, "_PENDING", [])
    monkeypatch.setattr(rc, "_MAPPED", {"bytes": 0})
    FakeEvent.done = False
    return d


def test_ensure_maps_granules_ahead_and_never_past_the_span(driver):
    span = rc.CudaSpan(100 * GRAN + 5, torch.device("cuda", 0))
    assert span.nbytes == 101 * GRAN and span.mapped == GRAN  # one granule before torch wraps it
    span.ensure(GRAN)  # already mapped
    assert span.mapped == GRAN
    span.ensure(GRAN + 1)
    assert span.mapped == 2 * GRAN
    span.ensure(40 * GRAN + 1)
    assert span.mapped == 41 * GRAN
    span.ensure(41 * GRAN + 1)  # map-ahead: an eighth of what is held (5 granules), not one
    assert span.mapped == 46 * GRAN
    span.ensure(span.nbytes)
    assert span.mapped == span.nbytes
    assert rc._MAPPED["bytes"] == span.mapped
    # the mappings tile [0, mapped) of the span: back to back, none twice (the fake refuses overlaps)
    ends = span.ptr.value
    for va, size in sorted(driver.maps):
        assert va == ends
        ends += size
    assert ends == span.ptr.value + span.mapped


def test_failed_access_leaves_no_stray_mapping(driver):
    span = rc.CudaSpan(10 * GRAN, torch.device("cuda", 0))
    driver.fail_access = True
    with pytest.raises(RuntimeError, match="cuMemSetAccess"):
        span.ensure(3 * GRAN)
    assert span.mapped == GRAN and sum(s for _, s in driver.maps) == GRAN
    driver.fail_access = False
    span.ensure(3 * GRAN)  # the range maps again
    assert span.mapped == 3 * GRAN


def test_a_dead_span_is_freed_after_its_event_and_not_while_capturing(driver, monkeypatch):
    span = rc.CudaSpan(10 * GRAN, torch.device("cuda", 0))
    span.ensure(4 * GRAN)
    va = span.ptr.value
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    del span  # during a capture: no event can be recorded, nothing is freed
    assert len(rc._PENDING) == 1 and rc._PENDING[0][0] is None and va in driver.ranges
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert rc.mapped_bytes() == 4 * GRAN  # the event is recorded now; queued work not done yet
    assert isinstance(rc._PENDING[0][0], FakeEvent) and va in driver.ranges
    FakeEvent.done = True
    assert rc.mapped_bytes() == 0 and not rc._PENDING
    assert va not in driver.ranges and not driver.maps


def test_cuda_reservations_are_on_by_default_and_env_turns_them_off(monkeypatch):
    """The default (session 22): CUDA pools live in reservations wherever the driver's VMM calls load;
    ``GAAC_RESERVE_CUDA=0`` turns them off. No driver here: the granularity query is replaced."""
    from gaac_hf.cache import reserve

    monkeypatch.setattr(rc, "granularity", lambda index: GRAN)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    dev = torch.device("cuda", 0)
    monkeypatch.delenv("GAAC_RESERVE_CUDA", raising=False)
    assert reserve.enabled(dev)
    monkeypatch.setenv("GAAC_RESERVE_CUDA", "0")
    assert not reserve.enabled(dev)
    monkeypatch.setenv("GAAC_RESERVE_CUDA", "1")
    assert reserve.enabled(dev)
    monkeypatch.setattr(rc, "granularity", lambda index: 0)  # the VMM calls did not load
    assert not reserve.enabled(dev)
