"""Tensors that grow without moving: address space reserved once, pages committed as rows are added.

A GAAC pool grows whenever a decode step finishes blocks. Growing a tensor by allocating a larger one
and copying the old one in copies the whole history at every growth (with exact CPU sizes: at every
finished block, quadratic over a generation) and briefly holds both copies. Here a pool tensor is a
view of the first rows of a *reservation*: a span of address space taken once (Linux anonymous
``mmap`` with ``MAP_NORESERVE``: no physical page exists until it is written). Growing re-views more
rows of the same storage: nothing moves, nothing is copied, the old rows keep their addresses (so
pointers a kernel or a CUDA graph holds stay valid) and only the pages the new rows touch are taken.

Design follows what virtual-memory KV caches do on the GPU (CUDA VMM: reserve, then map pages) and
``vm_reserve`` style allocators, with the host's demand paging as the page mapper.

A pool starts as an ordinary tensor and grows by copying while it is smaller than
:data:`MIN_BYTES` (a copy of at most that much); the growth that takes it past it moves it into a
reservation, and every later growth is in place. (Small tensors stay ordinary because a reservation's
last page counts whole: 4 KiB held for an 8-byte column would be most of a short prompt's cache.) Compaction (after crop or batch selection) builds an ordinary tensor again.

Invariants this module keeps, and which its callers must too:

- A reservation is handed out as one view starting at its first byte; :func:`grow` only extends it.
  Rows past the largest extent ever handed out were never written, so they read as zeros and new
  rows need no clearing. A caller that wants fewer rows builds a new tensor (compaction does).
- ``held_bytes`` of a reserved view is its bytes rounded up to the OS page: the pages it can have
  touched. That is what :meth:`GAACCache.stats` counts as allocated.
- ``copy.deepcopy`` of a reserved view would copy the whole reservation (the storage is its full
  size): pools copy their reserved tensors with :func:`clone` instead (:class:`DeepcopyReserved`).

Where reservations are used: CPU tensors on Linux (``GAAC_RESERVE=0`` turns them off, e.g. under
``vm.overcommit_memory=2``, where ``MAP_NORESERVE`` is ignored). A reservation that cannot be made falls
back to an ordinary tensor, which grows by copying as before. On CUDA the pools still grow by a device
copy in fixed pages (``docs/CACHE.md`` "Memory"): the CUDA counterpart (VMM map-on-grow) is not built.
"""
from __future__ import annotations

import copy
import math
import mmap
import os
import sys
import weakref

import torch

#: Linux's MAP_NORESERVE (the mmap module does not export it): no swap is accounted for the span
_MAP_NORESERVE = 0x4000
PAGE = mmap.PAGESIZE
#: bytes of address space one reservation takes: a CPU buffer never outgrows the machine's memory
#: (one that does moves once into a reservation twice as large)
SPAN_BYTES = 1 << 40
#: tensors smaller than this stay ordinary (grown by copying): a reservation's rounding to the page
#: is then at most 1/16 of what it holds
MIN_BYTES = 16 * PAGE
#: address space all live reservations may take together (x86-64 user space is 128 TiB)
BUDGET_BYTES = 1 << 45

# storage address -> [span bytes, largest extent handed out (bytes)]; an entry leaves with its mmap
_LIVE: dict[int, list[int]] = {}


def _span_bytes() -> int:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = SPAN_BYTES
    return min(SPAN_BYTES, -(-ram // PAGE) * PAGE)


def enabled(device: torch.device) -> bool:
    """Whether tensors on ``device`` are made in reservations (CPU, Linux, ``GAAC_RESERVE`` not 0)."""
    return (torch.device(device).type == "cpu" and sys.platform.startswith("linux")
            and os.environ.get("GAAC_RESERVE", "1") != "0")


def _reserve(nbytes: int) -> torch.Tensor | None:
    """uint8 ``[nbytes]`` over fresh anonymous memory, or None when the address space is not given."""
    if sum(span for span, _ in _LIVE.values()) + nbytes > BUDGET_BYTES:
        return None
    try:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except (OSError, ValueError, OverflowError):
        return None
    base = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mmap alive while any view lives
    key = base.data_ptr()
    _LIVE[key] = [nbytes, 0]
    weakref.finalize(mm, _LIVE.pop, key, None)
    return base


def _entry(t: torch.Tensor) -> list[int] | None:
    if t.device.type != "cpu" or t.storage_offset() != 0 or not t.is_contiguous():
        return None
    return _LIVE.get(t.untyped_storage().data_ptr())


def is_reserved(t: torch.Tensor) -> bool:
    """Whether ``t`` is the view of a reservation that :func:`grow` extends in place."""
    return _entry(t) is not None


def _view(base_storage: torch.UntypedStorage, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(0, dtype=dtype)
    stride = torch.empty(shape, dtype=dtype, device="meta").stride()
    return out.set_(base_storage, 0, shape, stride)


def _row_bytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape[1:]) * torch.empty(0, dtype=dtype).element_size()


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A zero tensor of ``shape`` that :func:`grow` can extend along dim 0 without copying, where
    reservations are enabled (:func:`enabled`); else ``torch.zeros``."""
    shape = list(shape)
    if enabled(device):
        nbytes = shape[0] * _row_bytes(shape, dtype)
        span = _span_bytes()
        base = _reserve(span if nbytes <= span else -(-2 * nbytes // PAGE) * PAGE)
        if base is not None:
            t = _view(base.untyped_storage(), shape, dtype)
            _LIVE[base.data_ptr()][1] = nbytes
            return t
    return torch.zeros(shape, dtype=dtype, device=device)


def grow(t: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``t`` with ``rows`` rows along dim 0 (``rows`` >= its rows), same storage and addresses, the new
    rows zero; None when ``t`` is not a reservation's view or its span is too small."""
    entry = _entry(t)
    if entry is None:
        return None
    end = rows * _row_bytes(t.shape, t.dtype)
    if end > entry[0]:
        return None
    have = t.numel() * t.element_size()
    out = _view(t.untyped_storage(), [rows, *t.shape[1:]], t.dtype)
    if entry[1] > have:  # bytes handed out before and given back: clear them (virgin pages read as zero)
        out.view(-1).view(torch.uint8)[have : min(end, entry[1])].zero_()
    entry[1] = max(entry[1], end)
    return out


def grow_or_copy(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with ``rows`` rows along dim 0 (``rows`` >= its rows), old rows kept and new ones zero: in
    place where ``t`` is a reservation's view with room (:func:`grow`), else copied into a new tensor
    (a reservation where enabled and ``t`` reaches :data:`MIN_BYTES`, so that later growth is in place)."""
    out = grow(t, rows)
    if out is None:
        shape = [rows, *t.shape[1:]]
        if rows * _row_bytes(shape, t.dtype) < MIN_BYTES:
            out = torch.zeros(shape, dtype=t.dtype, device=t.device)
        else:
            out = empty(shape, t.dtype, t.device)
        out[: t.shape[0]] = t
    return out


def held_bytes(t: torch.Tensor) -> int:
    """Bytes of memory ``t``'s elements can occupy: their size, rounded up to the page for a reservation
    (pages past the view were never touched and hold nothing)."""
    n = t.numel() * t.element_size()
    return -(-n // PAGE) * PAGE if is_reserved(t) else n


def clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that grows in place as ``t`` does: a fresh reservation for a reserved view."""
    if not is_reserved(t):
        return t.clone()
    out = empty(list(t.shape), t.dtype, t.device)
    out.copy_(t)
    return out


def committed_bytes() -> int:
    """Bytes every live reservation may hold in this process (largest extents, page-rounded): what a
    tensor-bytes meter adds, since reservations are not tensors an aten op returns."""
    return sum(-(-high // PAGE) * PAGE for _, high in _LIVE.values())


class DeepcopyReserved:
    """Mixin: ``copy.deepcopy`` copies reserved tensor attributes with :func:`clone`, and pickling
    (``torch.save``) writes only their rows (a plain deepcopy or pickle of a view takes its storage: the
    whole span); everything else as usual."""

    def __getstate__(self):
        return {k: v.clone() if isinstance(v, torch.Tensor) and is_reserved(v) else v for k, v in self.__dict__.items()}

    def __deepcopy__(self, memo):
        out = self.__class__.__new__(self.__class__)
        memo[id(self)] = out
        for name, value in self.__dict__.items():
            if isinstance(value, torch.Tensor) and is_reserved(value):
                setattr(out, name, clone(value))
            else:
                setattr(out, name, copy.deepcopy(value, memo))
        return out
