"""CUDA reservations for :mod:`gaac_hf.cache.reserve`: the driver's virtual memory management.

A :class:`CudaSpan` takes a range of device address space once (``cuMemAddressReserve``) and maps
physical memory into it in granules (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``, 2 MiB on
Hopper) as the pool that views it grows, so growth neither copies nor moves the history and pointers a
kernel or a captured CUDA graph holds stay valid. Mapping is a host call with no stream work (the driver
notes that mapping calls may synchronize internally: it maps ahead by an eighth of what it holds, at
least a granule, so growth maps rarely); the new rows are cleared by the caller on the current stream
(stream-ordered). The physical handle is released right after mapping (the mapping keeps the memory
until it is unmapped). When the last tensor on a span dies, the span records an event on the current
stream and its range is unmapped and freed once that event has completed (checked without waiting at
the next span call, :func:`release_done`), never inside a CUDA-graph capture.

Design follows the VMM recipe of NVIDIA's "Introducing Low-Level GPU Virtual Memory Management" and
vAttention-style KV caches (reserve a virtual range per tensor, map pages on demand); the calls go
through ``ctypes`` to ``libcuda`` so that no CUDA Python package is needed.

Status: written in a CPU-only session (20); ``tests/test_cache_reserve_gpu.py`` (marker ``gpu``: granules
mapped in place, ``generate`` bit-identical with and without reservations, no reserved pool moves, decode
steps free of host syncs) passed on an H100 in session 21 (``lab/results/v2_session21/pytest_gpu_v2.txt``).
On by default from session 22 (the memory A/B of call V1: ``docs/CACHE.md`` "Memory");
``GAAC_RESERVE_CUDA=0`` turns it off.
Memory mapped here is outside PyTorch's caching allocator: ``torch.cuda.memory_allocated`` does not
see it; :func:`mapped_bytes` does (``eval/memory_report.py --gpu`` adds it).
"""
from __future__ import annotations

import ctypes
import functools

import torch

CUDA_SUCCESS = 0
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CUDA_ERROR_OUT_OF_MEMORY = 2


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.lru_cache(maxsize=1)
def _libcuda():
    """The driver library, or None where it cannot be loaded."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        lib.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), sz, sz, u64, ctypes.c_ulonglong]
        lib.cuMemAddressFree.argtypes = [u64, sz]
        lib.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), sz, ctypes.POINTER(_AllocProp), ctypes.c_ulonglong]
        lib.cuMemRelease.argtypes = [ctypes.c_ulonglong]
        lib.cuMemMap.argtypes = [u64, sz, sz, ctypes.c_ulonglong, ctypes.c_ulonglong]
        lib.cuMemUnmap.argtypes = [u64, sz]
        lib.cuMemSetAccess.argtypes = [u64, sz, ctypes.POINTER(_AccessDesc), sz]
        lib.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(sz), ctypes.POINTER(_AllocProp), ctypes.c_int]
        return lib
    return None


def _check(rc: int, what: str) -> None:
    if rc != CUDA_SUCCESS:
        raise RuntimeError(f"GAAC CUDA reservation: {what} failed with CUresult {rc}")


def _prop(index: int) -> _AllocProp:
    p = _AllocProp()
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = index
    return p


@functools.lru_cache(maxsize=None)
def granularity(index: int) -> int:
    """The recommended mapping granule of device ``index`` (bytes), or 0 where VMM is unusable."""
    lib = _libcuda()
    if lib is None:
        return 0
    torch.cuda.init()  # the primary context torch uses is current from here on
    g = ctypes.c_size_t(0)
    prop = _prop(index)
    if lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_RECOMMENDED):
        return 0
    return int(g.value)


_MAPPED = {"bytes": 0}
# ranges of dead spans waiting for the work queued before their death: [event or None, lib, ptr, mapped, nbytes]
_PENDING: list[list] = []


def release_done() -> None:
    """Unmap and free the ranges of dead spans whose queued work has completed (no waiting)."""
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    keep = []
    for item in _PENDING:
        ev, lib, ptr, mapped, nbytes = item
        if ev is None and not capturing:
            item[0] = ev = torch.cuda.Event()
            ev.record()
        if ev is None or not ev.query():
            keep.append(item)
            continue
        if mapped and lib.cuMemUnmap(ptr, mapped) != CUDA_SUCCESS:
            continue  # left mapped (and counted): never free a range that is still mapped
        _MAPPED["bytes"] -= mapped
        lib.cuMemAddressFree(ptr, nbytes)
    _PENDING[:] = keep


def mapped_bytes() -> int:
    """Device bytes mapped by the spans of this process (dead ones until their range is freed)."""
    release_done()
    return _MAPPED["bytes"]


class CudaSpan:
    """``nbytes`` of device address space on ``device``, mapped from the start as :meth:`ensure` asks.

    Exposes ``__cuda_array_interface__`` (uint8 ``[nbytes]``) so that ``torch.as_tensor`` wraps it; the
    tensor keeps this object alive, and it unmaps and frees its range when collected.
    """

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.lib = _libcuda()
        self.index = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
        self.gran = granularity(self.index)
        if self.lib is None or not self.gran:
            raise RuntimeError("GAAC CUDA reservation: the driver's VMM calls are not available")
        self.nbytes = -(-nbytes // self.gran) * self.gran
        self.mapped = 0
        self.ptr = ctypes.c_uint64(0)
        release_done()
        with torch.cuda.device(self.index):
            _check(self.lib.cuMemAddressReserve(ctypes.byref(self.ptr), self.nbytes, self.gran, 0, 0), "cuMemAddressReserve")
        self.ensure(1)  # one granule mapped before torch wraps the range (it asks the driver about the pointer)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (int(self.ptr.value), False), "version": 3,
                "strides": None, "stream": None}

    def ensure(self, end: int) -> None:
        """Map physical memory so that bytes ``[0, end)`` are readable and writable. A failed
        allocation frees PyTorch's cached blocks and tries once more before raising."""
        need = -(-end // self.gran) * self.gran
        if need <= self.mapped:
            return
        # map ahead by an eighth of what is held (at least the granule): fewer driver calls as a pool grows
        ahead = max(self.gran, self.mapped // 8 // self.gran * self.gran)
        want = min(self.nbytes, max(need, self.mapped + ahead))
        size = want - self.mapped
        with torch.cuda.device(self.index):
            handle = ctypes.c_ulonglong(0)
            prop = _prop(self.index)
            rc = self.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0)
            if rc == CUDA_ERROR_OUT_OF_MEMORY:
                torch.cuda.empty_cache()
                rc = self.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0)
            if rc == CUDA_ERROR_OUT_OF_MEMORY:
                raise torch.cuda.OutOfMemoryError(f"GAAC CUDA reservation: cannot map {size} more bytes")
            _check(rc, "cuMemCreate")
            try:
                _check(self.lib.cuMemMap(self.ptr.value + self.mapped, size, 0, handle, 0), "cuMemMap")
            finally:
                self.lib.cuMemRelease(handle)  # the mapping holds the memory from here on
            desc = _AccessDesc()
            desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = self.index
            desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            rc = self.lib.cuMemSetAccess(self.ptr.value + self.mapped, size, ctypes.byref(desc), 1)
            if rc != CUDA_SUCCESS:
                self.lib.cuMemUnmap(self.ptr.value + self.mapped, size)  # no stray mapping past `mapped`
                _check(rc, "cuMemSetAccess")
        self.mapped = want
        _MAPPED["bytes"] += size

    def __del__(self) -> None:
        lib, ptr = getattr(self, "lib", None), getattr(self, "ptr", None)
        if lib is None or ptr is None or not ptr.value:
            return
        # kernels queued on the range may still read it: freed once an event recorded now has completed
        _PENDING.append([None, lib, ptr.value, self.mapped, self.nbytes])
        try:
            release_done()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees it with the context
            pass
