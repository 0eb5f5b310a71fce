"""Host-side helpers shared by the layers of one cache, all about not stalling the GPU.

* :class:`_HostSlab`: one pinned allocation for every non-blocking counter copy of a cache.
* :class:`_CountsMemo`: the ``num_blocks`` / ``tail_len`` device tensors, made once per step.
* :class:`_DeviceTables`: the calibration table copied to each device once.
* :class:`_DeferredStore`: a prefill's store parked until the next layer's append (no sync inside a layer).
"""
from __future__ import annotations

import torch

from ..calibration.table import CalibrationTable


#: pinned int64 counters per GAAC layer: 2 per pool snapshot (K, V) + 8 deferred sync terms
_HOST_SLOTS_PER_LAYER = 12


class _HostSlab:
    """Pinned host memory for the non-blocking counter copies of a whole cache, allocated once.

    Each pool snapshots 2 counters and each layer's deferred store 8 sync terms; a pinned allocation
    per buffer (cudaHostAlloc, ~1 ms, and it synchronizes) cost ~90 ms per 36-layer prefill on the
    H200, a fixed cost that showed as +4.5% prefill time at 32K (``e2e_h200_prefill_deferred.json``).
    One slab per cache, handed out in slices, is one allocation.
    """

    __slots__ = ("n", "used", "buf")

    def __init__(self, n: int) -> None:
        self.n, self.used, self.buf = n, 0, None

    def take(self, k: int) -> torch.Tensor:
        """A pinned int64 ``[k]`` slice (a new slab when this one is full)."""
        if self.buf is None or self.used + k > self.buf.numel():
            self.buf = torch.zeros(max(self.n, k), dtype=torch.int64, pin_memory=True)
            self.used = 0
        out = self.buf[self.used : self.used + k]
        self.used += k
        return out


class _CountsMemo:
    """``num_blocks`` / ``tail_len`` int32 ``[B]`` device tensors for :meth:`GAACLayer.paged_kv`,
    kept for the last ``(B, num_blocks, tail_len, device)`` asked for.

    One memo is shared by the layers of a :class:`GAACCache`: in a decode step every layer holds the
    same counts, so the first layer's paged_kv() makes the two tensors and the other layers reuse
    them (two ``torch.full`` per step instead of two per layer). Keyed by value, and the tensors are
    never written (the attention kernel only reads them), so reorder / select / crop / reset need no
    invalidation: a changed batch or length is a different key.
    """

    __slots__ = ("key", "value")

    def __init__(self) -> None:
        self.key = None
        self.value = None

    def get(self, b: int, num_blocks: int, tail_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (b, num_blocks, tail_len, device)
        if key != self.key:
            self.value = (torch.full((b,), num_blocks, dtype=torch.int32, device=device),
                          torch.full((b,), tail_len, dtype=torch.int32, device=device))
            self.key = key
        return self.value


class _DeviceTables:
    """The calibration table on the cache's device(s), copied once per cache and device.

    One memo is shared by the layers of a :class:`GAACCache`. A host-to-device copy from pageable
    memory synchronizes the host with the GPU; copying each layer's four base rows on its first
    update was 4 syncs per layer in a prefill (found with ``eval/find_syncs.py``), each draining the
    GPU queue while the host still had the layer to enqueue. Keyed by the device and the kv-head
    range (tensor-parallel shards): the whole table moves once (a few KB), from pinned memory.
    """

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key = {}

    def get(self, table: CalibrationTable, device: torch.device) -> CalibrationTable:
        if device.type == "cpu":
            return table
        if table.base8.device == device:
            return table
        key = (str(device), tuple(table.meta.get("kv_head_range") or ()))
        hit = self._by_key.get(key)
        if hit is None:
            # from pinned memory without blocking, and not validated again: no sync at all
            hit = self._by_key[key] = table.to(device, non_blocking=table.base8.device.type == "cpu")
        return hit


class _DeferredStore:
    """The one append whose storing waits for device counters (shared by the layers of a cache).

    A prefill's append must know how many raw rows and escape bytes its blocks need before it can
    place them, and those are device values: reading them right away is a host sync per layer that
    drains the GPU queue while the host has the rest of the layer still to enqueue (measured on the
    H200: +5.7% prefill time at 32K, ``eval/results/e2e_h200_32k_b1.json``). Instead the layer
    copies them to pinned host memory without blocking, records an event and parks the encoded
    blocks here; the next append of any layer, or any read of the pending layer's pools, stores
    them (:meth:`flush`). By then the GPU has long passed the event, and the host waits at most for
    the encoder of the previous layer while the GPU still has that layer's attention and MLP queued.
    The prefill's own attention reads its uncompressed input (``GAACLayer._recent``), never the
    parked blocks, so nothing has to wait inside a layer. Costs the encoded blocks of one layer held
    one layer longer.
    """

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = None  # (layer, args of GAACLayer._store_deferred)

    def flush(self) -> None:
        if self.pending is not None:
            layer, args = self.pending
            self.pending = None
            layer._store_deferred(*args)

    def drop(self, layer) -> None:
        if self.pending is not None and self.pending[0] is layer:
            self.pending = None
