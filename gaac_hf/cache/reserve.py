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
  size): pools copy their reserved tensors with :func:`clone` instead (:class:`DeepcopyReserved`). On
  CUDA any op that reads a reserved tensor's whole *storage* (``untyped_storage()``) touches unmapped
  addresses, an illegal-address error: only the views are for use.

Where reservations are used: CPU tensors on Linux (``GAAC_RESERVE=0`` turns them off, e.g. under
``vm.overcommit_memory=2``, where ``MAP_NORESERVE`` is ignored). A reservation that cannot be made falls
back to an ordinary tensor, which grows by copying as before. CUDA tensors too, wherever the driver's VMM
calls load (:mod:`gaac_hf.cache.reserve_cuda`: granules of 2 MiB mapped as rows are added and cleared on the
current stream); ``GAAC_RESERVE_CUDA=0`` turns them off, and CUDA pools then grow by a device copy in fixed
pages (``docs/CACHE.md`` "Memory").
"""
from __future__ import annotations

import copy
import functools
import math
import mmap
import os
import sys
import weakref
from dataclasses import dataclass

import torch

#: Linux's MAP_NORESERVE (the mmap module does not export it): no swap is accounted for the span
_MAP_NORESERVE = 0x4000
PAGE = mmap.PAGESIZE
#: bytes of address space one CPU reservation takes at most (it also never exceeds the machine's
#: memory: a buffer that outgrows it moves once into a reservation twice as large)
SPAN_BYTES = 1 << 40
#: CPU tensors smaller than this stay ordinary (grown by copying): a reservation's rounding to the page
#: is then at most 1/16 of what it holds. CUDA: 8 granules (2 MiB each on Hopper), at most 1/8.
MIN_BYTES = 16 * PAGE
MIN_GRANULES_CUDA = 8
#: address space the live reservations of one device type may take together (x86-64 user space is 128 TiB;
#: Hopper's GPU virtual address space 128 TiB or more)
BUDGET_BYTES = 1 << 45
#: a CUDA span covers this fraction of the device's memory (a pool of one layer and kind never needs more
#: for a model of 8+ layers; one that does moves once into a span twice its size)
CUDA_SPAN_FRACTION = 8


@dataclass
class _Span:
    """One live reservation: its size, the largest extent handed out, its page (OS page or CUDA granule)
    and, on CUDA, the :class:`~gaac_hf.cache.reserve_cuda.CudaSpan` that maps it."""

    nbytes: int
    high: int
    page: int
    cuda: object = None

    def held(self, end: int) -> int:
        if self.cuda is not None:
            return self.cuda.mapped
        return -(-end // self.page) * self.page


# storage address -> its span; an entry leaves when the memory behind it is released
_LIVE: dict[int, _Span] = {}


def _cpu_span_bytes() -> int:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = SPAN_BYTES
    return min(SPAN_BYTES, -(-ram // PAGE) * PAGE)


def _cuda_ok(device: torch.device) -> bool:
    if os.environ.get("GAAC_RESERVE_CUDA", "1") == "0":
        return False
    from . import reserve_cuda

    return reserve_cuda.granularity(device.index if device.index is not None else torch.cuda.current_device()) > 0


@functools.lru_cache(maxsize=1)
def _cpu_spans_given() -> bool:
    """Whether this process may map a span (an address-space limit or strict overcommit refuses it)."""
    try:
        mmap.mmap(-1, _cpu_span_bytes(), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE).close()
    except (OSError, ValueError, OverflowError):
        return False
    return True


def enabled(device) -> bool:
    """Whether tensors on ``device`` are made in reservations: CPU on Linux unless ``GAAC_RESERVE=0`` (and
    where the system gives such spans at all); CUDA where the driver's VMM calls load unless
    ``GAAC_RESERVE_CUDA=0``."""
    device = torch.device(device)
    if device.type == "cpu":
        return (sys.platform.startswith("linux") and os.environ.get("GAAC_RESERVE", "1") != "0"
                and _cpu_spans_given())
    return device.type == "cuda" and _cuda_ok(device)


def min_bytes(device) -> int:
    """Size from which :func:`grow_or_copy` moves a tensor on ``device`` into a reservation."""
    device = torch.device(device)
    if device.type == "cuda":
        from . import reserve_cuda

        return MIN_GRANULES_CUDA * reserve_cuda.granularity(device.index if device.index is not None else torch.cuda.current_device())
    return MIN_BYTES


def _reserve(nbytes: int, device: torch.device) -> torch.Tensor | None:
    """uint8 ``[nbytes]`` over fresh address space on ``device``, or None when it is not given."""
    if sum(s.nbytes for s in list(_LIVE.values()) if (s.cuda is not None) == (device.type == "cuda")) + nbytes > BUDGET_BYTES:
        return None
    if device.type == "cuda":
        from . import reserve_cuda

        try:
            span = reserve_cuda.CudaSpan(nbytes, device)
        except RuntimeError:
            return None
        base = torch.as_tensor(span, device=torch.device("cuda", span.index))  # keeps the span alive while any view lives
        if base.data_ptr() != span.ptr.value:
            raise RuntimeError("GAAC CUDA reservation: torch wrapped the span at another address")
        # a weak reference: the entry must not keep the span (and its mapped memory) alive
        _LIVE[base.data_ptr()] = entry = _Span(span.nbytes, 0, span.gran, weakref.proxy(span))
        weakref.finalize(span, _forget, base.data_ptr(), entry)
        return base
    try:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except (OSError, ValueError, OverflowError):
        return None
    base = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mmap alive while any view lives
    _LIVE[base.data_ptr()] = entry = _Span(nbytes, 0, PAGE)
    weakref.finalize(mm, _forget, base.data_ptr(), entry)
    return base


def _forget(key: int, entry: _Span) -> None:
    if _LIVE.get(key) is entry:  # not a newer span that got the same address
        del _LIVE[key]


def _entry(t: torch.Tensor) -> _Span | None:
    if t.storage_offset() != 0 or not t.is_contiguous():
        return None
    return _LIVE.get(t.untyped_storage().data_ptr())


def is_reserved(t: torch.Tensor) -> bool:
    """Whether ``t`` is the view of a reservation that :func:`grow` extends in place."""
    return _entry(t) is not None


def _view(base_storage: torch.UntypedStorage, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(0, dtype=dtype, device=base_storage.device)
    stride = torch.empty(shape, dtype=dtype, device="meta").stride()
    return out.set_(base_storage, 0, shape, stride)


def _row_bytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape[1:]) * torch.empty(0, dtype=dtype).element_size()


def _hand_out(t: torch.Tensor, span: _Span, have: int, end: int) -> None:
    """Make bytes ``[have, end)`` of ``t``'s span usable and zero: map them (CUDA), clear what was
    handed out before (CPU: virgin pages read as zero) or everything new (CUDA memory is not cleared)."""
    if span.cuda is not None:
        span.cuda.ensure(end)
        clear_to = end
    else:
        clear_to = min(end, span.high)
    if clear_to > have:
        t.view(-1).view(torch.uint8)[have:clear_to].zero_()
    span.high = max(span.high, end)


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A zero tensor of ``shape`` that :func:`grow` can extend along dim 0 without copying, where
    reservations are enabled (:func:`enabled`); else ``torch.zeros``."""
    shape, device = list(shape), torch.device(device)
    if enabled(device):
        nbytes = shape[0] * _row_bytes(shape, dtype)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            span = max(total // CUDA_SPAN_FRACTION, 2 * nbytes)
        else:
            span = _cpu_span_bytes()
            span = span if nbytes <= span else -(-2 * nbytes // PAGE) * PAGE
        base = _reserve(span, device)
        if base is not None:
            t = _view(base.untyped_storage(), shape, dtype)
            _hand_out(t, _LIVE[base.data_ptr()], 0, nbytes)
            return t
    return torch.zeros(shape, dtype=dtype, device=device)


def grow(t: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``t`` with ``rows`` rows along dim 0 (``rows`` >= its rows), same storage and addresses, the new
    rows zero; None when ``t`` is not a reservation's view or its span is too small."""
    span = _entry(t)
    if span is None:
        return None
    end = rows * _row_bytes(t.shape, t.dtype)
    if end > span.nbytes:
        return None
    out = _view(t.untyped_storage(), [rows, *t.shape[1:]], t.dtype)
    _hand_out(out, span, t.numel() * t.element_size(), end)
    return out


def grow_or_copy(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with ``rows`` rows along dim 0 (``rows`` >= its rows), old rows kept and new ones zero: in
    place where ``t`` is a reservation's view with room (:func:`grow`), else copied into a new tensor
    (a reservation where enabled and ``t`` reaches :func:`min_bytes`, so that later growth is in place)."""
    out = grow(t, rows)
    if out is None:
        shape = [rows, *t.shape[1:]]
        if rows * _row_bytes(shape, t.dtype) < min_bytes(t.device):
            out = torch.zeros(shape, dtype=t.dtype, device=t.device)
        else:
            out = empty(shape, t.dtype, t.device)
        out[: t.shape[0]] = t
    return out


def held_bytes(t: torch.Tensor) -> int:
    """Bytes of memory ``t``'s elements can occupy: their size, or for a reservation the pages (CPU,
    rounded up) or granules (CUDA, mapped) behind it."""
    span = _entry(t)
    n = t.numel() * t.element_size()
    return n if span is None else span.held(n)


def clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that grows in place as ``t`` does: a fresh reservation for a reserved view."""
    if not is_reserved(t):
        return t.clone()
    out = empty(list(t.shape), t.dtype, t.device)
    out.copy_(t)
    return out


def committed_bytes(device_type: str = "cpu") -> int:
    """Bytes every live reservation on ``device_type`` may hold in this process (CPU: largest extents,
    page-rounded; CUDA: mapped granules): what a tensor-bytes meter or a CUDA peak adds, since
    reservations are not memory an aten op or PyTorch's allocator returns."""
    spans = [s for s in list(_LIVE.values()) if (s.cuda is not None) == (device_type == "cuda")]
    return sum(s.held(s.high) for s in spans)


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
