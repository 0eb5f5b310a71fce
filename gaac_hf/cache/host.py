"""Host-side helpers shared by the layers of one cache, all about not stalling the GPU.

* :class:`_HostSlab`: one pinned allocation for every non-blocking counter copy of a cache.
* :class:`_CountsMemo`: the ``num_blocks`` / ``tail_len`` device tensors (and the append position), made once per step.
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
    H200, a fixed cost that showed as +4.5% prefill time at 32K
    (``lab/results/superseded/e2e_h200_prefill_deferred.json``).
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

    __slots__ = ("key", "value", "pos_key", "pos")

    def __init__(self) -> None:
        self.key = None
        self.value = None
        self.pos_key = None
        self.pos = None

    def get(self, b: int, num_blocks: int, tail_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (b, num_blocks, tail_len, device)
        if key != self.key:
            self.value = (torch.full((b,), num_blocks, dtype=torch.int32, device=device),
                          torch.full((b,), tail_len, dtype=torch.int32, device=device))
            self.key = key
        return self.value

    def position(self, tail_len: int, device) -> torch.Tensor:
        """int64 ``[1]`` device tensor holding ``tail_len``: where a decode step's one-launch tail append writes
        (``gaac_hf.kernels.cuda.tail``, which reads the position from device memory); one fill per step,
        never written afterwards, like the counts."""
        key = (tail_len, device)
        if key != self.pos_key:
            self.pos = torch.full((1,), tail_len, dtype=torch.int64, device=device)
            self.pos_key = key
        return self.pos


class _DeviceTables:
    """The calibration table on the cache's device(s), copied once per cache and device.

    One memo is shared by the layers of a :class:`GAACCache`. A host-to-device copy from pageable
    memory synchronizes the host with the GPU; copying each layer's four base rows on its first
    update was 4 syncs per layer in a prefill (found with ``eval/find_syncs.py``), each draining the
    GPU queue while the host still had the layer to enqueue. Keyed by the device and the kv-head
    range (tensor-parallel shards): the whole table moves once (a few KB), from pinned memory.
    """

    __slots__ = ("_by_key", "_consts")

    def __init__(self) -> None:
        self._by_key = {}
        self._consts = None  # (table, b8p, dbp) of the last pair_constants() call

    def pair_constants(self, table: CalibrationTable) -> tuple[torch.Tensor, torch.Tensor]:
        """The format v3 pair constants (``PagedTensorV3.pair_constants``) of every layer and kind of
        ``table`` (a table :meth:`get` returned): int32 ``[L, 2, H, D/2]`` each, computed once per cache
        instead of once per pool (60 small computations in a SmolLM2 prefill: ~0.4 ms each on 2 cores)."""
        from ..kernels.paged import PagedTensorV3

        if self._consts is None or self._consts[0] is not table:
            self._consts = (table, *PagedTensorV3.pair_constants(table.base8, table.base16))
        return self._consts[1], self._consts[2]

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
    H200: +5.7% prefill time at 32K, ``lab/results/superseded/e2e_h200_32k_b1.json``). Instead the layer
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


class _FitnessCheck:
    """Warns once per cache when the table does not fit the K/V it meets (shared by the layers).

    After the cache's first :data:`BLOCKS` encoded blocks, their bytes per block are compared with
    what the table's own calibration sample predicts (``meta["escapes"]["ratio_estimate"]``, else
    the mode shares), and the raw-fallback share with :data:`MAX_RAW_SHARE`. Everything it reads is on
    the host already: slot rows and block counts are host integers, raw rows and heap bytes come from
    the CPU counters (free) or the pools' non-blocking pinned snapshots on CUDA (if one has not
    landed yet the check waits for a later append): no host sync.
    """

    BLOCKS = 256
    #: warn below this fraction of the table's expected ratio, or above this raw-fallback share
    MIN_RATIO_FRACTION, MAX_RAW_SHARE = 0.95, 0.02

    __slots__ = ("table", "done", "layers")

    def __init__(self, table: CalibrationTable) -> None:
        self.table, self.done, self.layers = table, False, []

    def expected_ratio(self) -> float | None:
        from ..format import ESCAPE_BYTES, MODE_4BIT, MODE_RAW

        meta, g = self.table.meta, self.table.geometry
        est = (meta.get("escapes") or {}).get("ratio_estimate")
        if est:
            return float(est)
        shares = meta.get("mode_shares") or {}
        if not all(k in shares for k in ("K", "V")):
            return None
        esc = sum(shares[k]["4bit"] * ESCAPE_BYTES[MODE_4BIT] + shares[k]["raw"] * ESCAPE_BYTES[MODE_RAW] for k in "KV") / 2
        return g.raw_bytes / (g.slot_bytes + esc * g.groups)

    def observe(self) -> None:
        if self.done:
            return
        pools = [p for layer in self.layers if layer._pools is not None for p in layer._pools]
        if sum(p.encoded_blocks for p in pools) < self.BLOCKS:
            return
        blocks = slots = raw = heap = 0
        for p in pools:
            if hasattr(p, "snapshot"):  # a format v3 pool: its stored bytes count as heap bytes below
                used, r, n = p.snapshot()  # as of its last store whose counters reached the host: no sync
                if n < p.n_blocks // 2:
                    return  # (sync-free pool) snapshots still in flight: try at a later append
                blocks, raw, heap = blocks + n, raw + r, heap + used - r * self.table.geometry.raw_bytes
                continue
            blocks += p.encoded_blocks
            if p._snap_event is None:
                r, h = int(p.counts[3]), int(p.counts[5])  # CPU tensors: free to read
            elif p._snap_event.query():
                r, h = p._snap.tolist()
            else:
                return  # a snapshot still in flight: try at a later append
            slots, raw, heap = slots + p.n_slots, raw + r, heap + h
        self.done = True
        g = self.table.geometry
        ratio = blocks * g.raw_bytes / (slots * g.slot_bytes + heap + raw * g.raw_bytes)
        want = self.expected_ratio()
        problems = []
        if want and ratio < self.MIN_RATIO_FRACTION * want:
            problems.append(f"the first {blocks} blocks compress {ratio:.3f}x where the table's calibration predicts {want:.3f}x")
        if raw > self.MAX_RAW_SHARE * blocks:
            problems.append(f"{raw} of the first {blocks} blocks ({100 * raw / blocks:.1f}%) fell back to raw")
        if problems:
            import warnings

            m = self.table.meta
            made = f" (calibrated on {m.get('model_name', '?')} at context {m.get('context', '?')})"
            warnings.warn("GAACCache: the calibration table does not fit this K/V" + made + ": " + "; ".join(problems)
                          + ". Still lossless, but memory is not saved: make a table for this model at the context you "
                          "run with `gaac-calibrate --model <model> --context <tokens>`.", stacklevel=4)
