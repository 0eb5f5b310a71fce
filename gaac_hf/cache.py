"""GAACCache: a transformers ``Cache`` that stores full-attention KV as lossless GAAC blocks.

Layout (per full-attention layer, per kind K/V), shapes with B = batch rows, H = kv-heads,
T = ``geometry.block_size``, D = head_dim:

* ``slots``  uint8 ``[cap_slots, slot_bytes]``: a growable pool of encoded blocks' planes (append-only),
  with ``esc_start`` int64 ``[cap_slots]`` pointing at each block's escape stream in ``heap`` (uint8,
  the streams at their exact lengths: format v2, ``docs/FORMAT.md``).
* ``raw``    bf16 ``[cap_raw, T, D]``: blocks whose encoding did not fit a slot (``fits == False``).
* ``table``  int32 ``[B, H, cap_blocks]``: block j of row b, head h is slot ``e`` if ``e >= 0`` and
  raw block ``-e - 1`` otherwise. Only ``[:, :, :num_blocks]`` is meaningful.
* ``tail``   bf16 ``[B, H, T, D]``: the last, incomplete block (``tail_len < T`` tokens), uncompressed.

Fill-then-finalize: tokens go to the tail; whenever a block fills, all complete blocks of all rows and
heads are encoded with one :func:`~gaac_hf.codec.encode_blocks` call and appended to the pool; they are
never re-encoded. Beam search (``reorder_cache``), ``batch_repeat_interleave`` and
``batch_select_indices`` only re-index the tables and the tail: beams share pool entries.

How attention reads the blocks is described in :mod:`gaac_hf.attention`: ``update()`` returns the
full decompressed K/V unless the live model config selects the GAAC attention, in which case it
returns a tail carrier and the attention function reads this layer directly.

Host syncs: none in decode steps (raw-fallback rows are placed on the device and the host tracks an
upper bound refreshed from a non-blocking copy, see :class:`_BlockPool`). When a prefill (or a run
of long escape streams / raw fallbacks) outgrows the pools' headroom, the exact sizes K and V need
are copied to the host without blocking and the layer's blocks are stored at the next layer's
append (:class:`_DeferredStore`): the host then waits at most for the previous layer's encoder,
never drains the GPU queue inside a layer. A few syncs remain in the rare operations that compact
the pools (batch selection, crop) and in ``stats()``.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin, get_layer_types_and_kwargs

from . import attention as _attn
from .calibration import CalibrationTable
from .codec import decode_blocks, encode_blocks, escape_lengths
from .format import MODE_3BIT, MODE_4BIT, MODE_RAW, BlockGeometry

_K, _V = 0, 1
_REPO = Path(__file__).resolve().parents[1]


def _transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


# transformers < 5.18 treats a positive crop(n) as "keep n tokens"; later versions reject it.
_POSITIVE_CROP_IS_LENGTH = _transformers_version() < (5, 18)


def _grow(t: torch.Tensor, rows: int, dim: int = 0, slack: int = 0) -> torch.Tensor:
    """Return ``t`` with at least ``rows`` entries along ``dim``, old contents kept. When it must grow,
    it gets ``max(rows + slack, 2 * have)`` entries (doubling; ``slack``: headroom past ``rows``)."""
    have = t.shape[dim]
    if rows <= have:
        return t
    shape = list(t.shape)
    shape[dim] = max(rows + slack, 2 * have)
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, have).copy_(t)
    return out


def _headroom(need: int, step: int) -> int:
    """Spare rows to leave when a synced append (a prefill) sizes a pool for ``need`` rows: room for
    the next decode steps (``step`` rows each) so that the first block-completing steps after a
    prefill do not reallocate and copy the pool. Reported by ``stats()['allocated_bytes']``, not by
    ``'resident_bytes'``."""
    return max(2 * step, need // 16)


def _triton_codec(geometry: BlockGeometry, device) -> tuple | None:
    """(encode, decode, append_escapes) Triton kernels for CUDA tensors, byte/bit-identical to the
    reference codec, or None (CPU, kernels not importable, or a geometry they do not implement)."""
    if torch.device(device).type != "cuda":
        return None
    return _triton_kernels(geometry)


def _triton_kernels(geometry: BlockGeometry) -> tuple | None:
    """The Triton codec kernels for any device (the CPU runs them through Triton's interpreter, which
    the tests use to run the cache's CUDA path), or None."""
    try:
        from gaac_hf.kernels.decode import decode_blocks_triton
        from gaac_hf.kernels.encode import _check_geometry, append_escapes_triton, encode_blocks_triton

        _check_geometry(geometry)
    except Exception:  # noqa: BLE001 - no Triton, no kernels, or an unsupported layout: reference codec
        return None

    def enc(x, b8, b16, g):
        # rows as wide as the escape limit: longer streams belong to raw blocks and are never stored
        return encode_blocks_triton(x, b8, b16, g, with_tags=True, escape_width=g.escape_limit)

    return enc, decode_blocks_triton, append_escapes_triton


def _decode_tables():
    from gaac_hf.kernels.decode import decode_tables_triton  # only reached by pools with Triton kernels

    return decode_tables_triton


def _append_escapes_reference(enc, heap: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Reference twin of ``kernels.encode.append_escapes_triton``: the fitting blocks' streams are
    appended to ``heap`` in block order at ``used`` (advanced in place); returns int64 ``[N]`` starts.
    The last heap byte is a sink for the masked-out positions (no data-dependent shapes: no sync)."""
    lens = torch.where(enc.fits, enc.escape_len.to(torch.int64), 0)
    ends = torch.cumsum(lens, 0) + used.reshape(())
    start = ends - lens
    if lens.numel():
        k = torch.arange(enc.escapes.shape[1], device=heap.device)
        dest = torch.where(k < lens[:, None], start[:, None] + k, heap.numel() - 1)
        heap[dest.reshape(-1)] = enc.escapes.reshape(-1)
        used.copy_(ends[-1].reshape(used.shape))
    return start


class _BlockPool:
    """Encoded blocks of one kind (K or V) of one layer: slot pool + escape heap + raw pool.

    base8, base16: uint8 ``[H, D]`` windows of this layer and kind. On CUDA the Triton encoder and
    decoder of ``gaac_hf.kernels`` replace the reference codec (same bytes, same bits) unless
    ``triton_codec=False``.

    Storage (format v2): ``slots`` uint8 ``[cap, slot_bytes]``, one row per encoded block;
    ``esc_start`` int64 ``[cap]``, where row e's escape stream starts in ``heap`` (uint8, the
    streams at their exact lengths, appended in block order); ``raw`` bf16 ``[cap_raw, T, D]``.

    Every encoded block gets the next slot row, so slot positions never depend on the data; a block
    that does not fit (its stream is past ``geometry.escape_limit``) also gets a raw row, at a
    position computed on the device from the running raw count. The host keeps only upper bounds of
    raw rows and heap bytes in use (exact on CPU), refreshed without blocking from a pinned copy of
    the device counters that each append issues; it syncs only when a bound could overflow its pool
    (a prefill, or streams/raw fallbacks eating the headroom of at least ``2 * step_blocks`` blocks).
    Decode steps thus run without host syncs. A synced append also leaves slot and heap headroom
    (:func:`_headroom`), so the decode steps right after a prefill do not regrow the pools.
    """

    def __init__(self, geometry: BlockGeometry, base8: torch.Tensor, base16: torch.Tensor, device,
                 triton_codec: bool = True, step_blocks: int = 1, snap: torch.Tensor | None = None) -> None:
        g = self.geometry = geometry
        device = torch.device(device)
        kernels = _triton_codec(geometry, device) if triton_codec else None
        self.triton = kernels is not None
        self._encode, self._decode, self._append_escapes = kernels or (
            encode_blocks, partial(decode_blocks, validate=False), _append_escapes_reference)
        self.base8 = base8.to(device)
        self.base16 = base16.to(device)
        # At least one row each so gathers with clamped indices are always in range. The raw pool's
        # last row is a sink: writes of fitting blocks land there (no data-dependent shapes); the
        # heap's last byte likewise for the reference stream append.
        self.slots = torch.zeros(1, g.slot_bytes, dtype=torch.uint8, device=device)
        self.esc_start = torch.zeros(1, dtype=torch.int64, device=device)
        self.heap = torch.zeros(1, dtype=torch.uint8, device=device)
        self.raw = torch.zeros(1, g.block_size, g.head_dim, dtype=torch.bfloat16, device=device)
        self.n_slots = 0
        self.n_raw = 0  # upper bound of raw rows in use (exact on CPU)
        self.n_heap = 0  # upper bound of heap bytes in use (exact on CPU)
        self.encoded_blocks = 0
        self.step_blocks = step_blocks
        # Device-side: groups per mode (3-bit, 4-bit, raw) over every block encoded, raw rows in use,
        # slot rows left unused by raw fallbacks (until a compaction drops them), heap bytes in use.
        self.counts = torch.zeros(6, dtype=torch.int64, device=device)
        self._snap = self._snap_event = None
        if device.type == "cuda":
            self._snap = snap if snap is not None else _HostSlab(2).take(2)  # pinned int64 [2]
            self._snap_event = torch.cuda.Event()

    @property
    def mode_counts(self) -> torch.Tensor:
        return self.counts[:3]

    # -- appending: encode, reserve room (one host sync for several pools at most), store ----------
    def encode(self, blocks: torch.Tensor, heads: torch.Tensor):
        """Encode bf16 ``[N, T, D]`` blocks (``heads`` int64 ``[N]``) with this pool's windows."""
        return self._encode(blocks, self.base8[heads], self.base16[heads], self.geometry)

    def _has_headroom(self, n: int) -> bool:
        """Whether ``n`` more blocks surely fit (raw rows and escape streams) without reading the
        device counters; refreshes the host bounds from the last non-blocking snapshot first."""
        if self._snap_event is None:
            self.n_raw, self.n_heap = int(self.counts[3]), int(self.counts[5])  # CPU: free to read
        elif self._snap_event.query():
            self.n_raw, self.n_heap = self._snap.tolist()  # the last append's non-blocking copy has landed
        return (self.n_raw + n <= self.raw.shape[0] - 1
                and self.n_heap + n * self.geometry.escape_limit <= self.heap.shape[0] - 1)

    def _sync_terms(self, enc) -> list[torch.Tensor]:
        """Device scalars the exact reservation needs: raw rows in use, new raw blocks, heap bytes in
        use, new stream bytes."""
        lens = torch.where(enc.fits, enc.escape_len.to(torch.int64), 0).sum()
        return [self.counts[3], (~enc.fits).sum(), self.counts[5], lens]

    def _reserve_exact(self, cur: int, new: int, used: int, add: int) -> tuple[int, int]:
        limit = self.geometry.escape_limit
        self.raw = _grow(self.raw, cur + new + 2 * self.step_blocks + 1)
        self.heap = _grow(self.heap, used + add + 1, slack=_headroom(used + add, self.step_blocks * limit))
        self.n_heap = used + add
        return cur + new, new

    def _reserve_bound(self, n: int) -> tuple[int, None]:
        self.n_heap += n * self.geometry.escape_limit
        return self.n_raw + n, None

    def append(self, blocks: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Encode ``blocks`` bf16 ``[N, T, D]`` (``heads`` int64 ``[N]``: kv-head of each block).

        Returns int32 ``[N]`` block-table entries (slot index, or ``-raw_index - 1``).
        """
        return _append_pools([self], [blocks], heads)[0]

    def store(self, enc, blocks: torch.Tensor, ub: int, new: int | None) -> torch.Tensor:
        """Place encoded blocks (after :func:`_reserve_from`); returns int32 table entries."""
        n, s0 = blocks.shape[0], self.n_slots
        fits = enc.fits
        nfit = ~fits
        start = self._append_escapes(enc, self.heap, self.counts[5:6])  # int64 [N]; streams of fitting blocks
        raw_pos = self.counts[3] + torch.cumsum(nfit, 0) - 1  # int64 [N], valid where ~fits
        if new is None:
            # No sync (decode steps): every block takes the next slot row, a raw fallback's row stays
            # unused; every block is copied to the raw pool, fitting ones into the sink row.
            self.slots = _grow(self.slots, s0 + n)
            self.esc_start = _grow(self.esc_start, s0 + n)
            self.slots[s0 : s0 + n] = enc.slots
            self.esc_start[s0 : s0 + n] = start
            slot_pos = torch.arange(s0, s0 + n, device=fits.device)
            sink = torch.full_like(raw_pos, self.raw.shape[0] - 1)
            self.raw.index_copy_(0, torch.where(fits, sink, raw_pos), blocks)
            self.counts[4] += nfit.sum()
            self.n_slots = s0 + n
        else:
            # Synced anyway (prefill, or the headroom ran out): store compactly.
            n_fit = n - new
            slack = _headroom(s0 + n_fit, self.step_blocks)
            self.slots = _grow(self.slots, s0 + n_fit, slack=slack)
            self.esc_start = _grow(self.esc_start, s0 + n_fit, slack=slack)
            self.slots[s0 : s0 + n_fit] = enc.slots if new == 0 else enc.slots[fits]
            self.esc_start[s0 : s0 + n_fit] = start if new == 0 else start[fits]
            slot_pos = s0 + torch.cumsum(fits, 0) - 1
            if new:
                self.raw[ub - new : ub] = blocks[nfit]
            self.n_slots = s0 + n_fit
        entries = torch.where(fits, slot_pos, -raw_pos - 1)
        self.counts[3] += nfit.sum()
        # Compare-and-sum instead of bincount: CUDA bincount syncs to size its output.
        modes = torch.arange(3, device=enc.tags.device, dtype=enc.tags.dtype)
        self.counts[:3] += (enc.tags.reshape(-1, 1) == modes).sum(0)
        if self._snap is not None:
            self._snap.copy_(self.counts[3::2], non_blocking=True)  # raw rows, heap bytes
            # on the stream that runs the copy: the pool's device, which need not be the current one
            # (a model spread over several GPUs)
            self._snap_event.record(torch.cuda.current_stream(self.counts.device))
        self.n_raw = ub
        self.encoded_blocks += n
        return entries.to(torch.int32)

    def gather(self, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Decode table entries int ``[N]`` (``heads`` int64 ``[N]``) -> bf16 ``[N, T, D]``, bit-exact."""
        g = self.geometry
        if entries.numel() == 0:
            return torch.empty(0, g.block_size, g.head_dim, dtype=torch.bfloat16, device=self.slots.device)
        e = entries.to(torch.int64)
        # Raw entries decode a slot row too (discarded below): no data-dependent shapes, no syncs.
        s = e.clamp(min=0)
        out = self._decode(self.slots[s], (self.heap, self.esc_start[s]), self.base8[heads], self.base16[heads], g)
        if self.n_raw:
            out = torch.where((e < 0)[:, None, None], self.raw[(-e - 1).clamp(min=0)], out)
        return out

    def compact(self, live: torch.Tensor) -> torch.Tensor:
        """Drop pool rows and escape streams that no table references. ``live``: int entries in use
        (any shape). Returns ``live`` renumbered into the compacted pools (same shape, int32).
        Host syncs (torch.unique); only called from rare operations (batch selection, crop).
        """
        flat = live.reshape(-1).to(torch.int64)
        s_used = torch.unique(flat[flat >= 0])
        r_used = torch.unique(-flat[flat < 0] - 1)
        s_map = torch.full((max(self.n_slots, 1),), -1, dtype=torch.int64, device=flat.device)
        s_map[s_used] = torch.arange(s_used.numel(), device=flat.device)
        r_map = torch.full((max(self.n_raw, 1),), -1, dtype=torch.int64, device=flat.device)
        r_map[r_used] = torch.arange(r_used.numel(), device=flat.device)
        # the kept slots' streams, repacked in slot order (lengths follow from the tag planes)
        lens = escape_lengths(self.slots[s_used], self.geometry)
        new_start = torch.cumsum(lens, 0) - lens
        total = int(lens.sum())
        owner = torch.repeat_interleave(torch.arange(s_used.numel(), device=flat.device), lens)
        src = self.esc_start[s_used][owner] + torch.arange(total, device=flat.device) - new_start[owner]
        heap = torch.zeros(total + 2 * self.step_blocks * self.geometry.escape_limit + 1, dtype=torch.uint8,
                           device=flat.device)
        heap[:total] = self.heap[src]
        self.heap = heap
        self.esc_start = new_start if s_used.numel() else self.esc_start[:1].clone()
        self.slots = self.slots[s_used] if s_used.numel() else self.slots[:1].clone()
        self.raw = torch.cat([self.raw[r_used], self.raw[-1:]])  # keeps the sink row last
        self.n_slots, self.n_raw, self.n_heap = int(s_used.numel()), int(r_used.numel()), total
        self.counts[3] = self.n_raw
        self.counts[4] = 0
        self.counts[5] = total
        new = torch.where(flat >= 0, s_map[flat.clamp(min=0)], -r_map[(-flat - 1).clamp(min=0)] - 1)
        return new.to(torch.int32).reshape(live.shape)

    def allocated_bytes(self) -> int:
        return self.slots.numel() + self.esc_start.numel() * 8 + self.heap.numel() + self.raw.numel() * 2


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
    """``num_blocks`` / ``tail_len`` int32 ``[B]`` device tensors for :meth:`GAACLayer.kernel_view`,
    kept for the last ``(B, num_blocks, tail_len, device)`` asked for.

    One memo is shared by the layers of a :class:`GAACCache`: in a decode step every layer holds the
    same counts, so the first layer's kernel_view() makes the two tensors and the other layers reuse
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


def _sync_plan(pools: list, encs: list) -> tuple[list[bool], torch.Tensor | None]:
    """Which pools lack headroom for their encoded batch, and (if any) the device scalars their exact
    reservation needs, stacked into one int64 tensor (reading it is the host sync)."""
    short = [not p._has_headroom(e.fits.shape[0]) for p, e in zip(pools, encs)]
    if not any(short):
        return short, None
    return short, torch.stack([t for p, e, s in zip(pools, encs, short) if s for t in p._sync_terms(e)])


def _reserve_from(pools: list, encs: list, short: list[bool], vals: list[int]) -> list[tuple[int, int | None]]:
    """Reserve room in each pool: exactly (from ``vals``, the read sync terms) where short, else
    within the headroom bounds."""
    it = iter(vals)
    return [p._reserve_exact(*(next(it) for _ in range(4))) if s else p._reserve_bound(e.fits.shape[0])
            for p, e, s in zip(pools, encs, short)]


def _append_pools(pools: list, blocks: list, heads: torch.Tensor) -> list[torch.Tensor]:
    """Encode and store one batch of blocks per pool (e.g. a layer's K and V): int32 entries each.
    At most ONE host sync for all pools (a prefill reads the exact counts of K and V at once);
    decode steps fit the headroom and do not sync."""
    encs = [p.encode(b, heads) for p, b in zip(pools, blocks)]
    short, terms = _sync_plan(pools, encs)
    res = _reserve_from(pools, encs, short, terms.tolist() if terms is not None else [])
    return [p.store(e, b, ub, new) for p, e, b, (ub, new) in zip(pools, encs, blocks, res)]


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


def _local_heads(table: CalibrationTable, heads: int, layer_idx: int) -> CalibrationTable:
    """The table rows for the kv-heads this process holds.

    Under tensor parallelism (transformers ``tp_plan="auto"``) k_proj/v_proj are split column-wise,
    so rank r of W holds kv-heads ``[r*H/W, (r+1)*H/W)`` of every layer. The cache is built from the
    (global) model config, so the local head count is only known from the first K/V it sees.
    """
    total = table.num_kv_heads
    if heads == total:
        return table
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1 and heads * world == total:
        r = dist.get_rank()
        return table.shard_heads(r * heads, (r + 1) * heads)
    raise ValueError(
        f"layer {layer_idx}: KV of {heads} kv-heads does not match the calibration table ({total} kv-heads"
        + (f", {world} tensor-parallel ranks)" if world > 1 else ")")
    )


class GAACLayer(CacheLayerMixin):
    """Cache layer of one full-attention layer holding GAAC-compressed K and V.

    Deliberately no ``_layer_type``: setting it would register this class in transformers'
    ``DYNAMIC_LAYER_TYPE_MAPPING`` and take over every ``DynamicCache(config=...)``.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, layer_idx: int, table: CalibrationTable, geometry: BlockGeometry, config,
                 return_full_kv: bool | None = None, fused: bool | str = True, triton_codec: bool = True,
                 counts_memo: _CountsMemo | None = None, deferred: _DeferredStore | None = None,
                 host_slab: _HostSlab | None = None, device_tables: _DeviceTables | None = None) -> None:
        super().__init__()
        self._device_tables = device_tables if device_tables is not None else _DeviceTables()  # see there
        self._counts_memo = counts_memo if counts_memo is not None else _CountsMemo()  # see kernel_view()
        self._deferred = deferred if deferred is not None else _DeferredStore()  # see _DeferredStore
        self._host_slab = host_slab if host_slab is not None else _HostSlab(_HOST_SLOTS_PER_LAYER)
        self.layer_idx = layer_idx
        self.geometry = geometry
        self._table = table
        self._config = config  # live model config: read at each update() to pick the return mode
        self._return_full_kv = return_full_kv
        self.fused = fused  # allow the Triton decode kernel (CUDA, q_len == 1) in GAAC attention
        self.triton_codec = triton_codec  # Triton encoder/decoder for CUDA pools (same bytes/bits)
        self._awaiting_attention = False
        self._reset_state()

    def _reset_state(self) -> None:
        self._deferred.drop(self)  # a parked append of this layer is void
        self.is_initialized = False
        self._pools: list[_BlockPool] | None = None
        self._tables: list[torch.Tensor] | None = None  # K and V, int32 [B, H, cap_blocks]
        self.tails: list[torch.Tensor] | None = None  # K and V, bf16 [B, H, T, D]
        self.num_blocks = 0
        self.tail_len = 0
        self._awaiting_attention = False
        # (blocks before the last update, [K, V] uncompressed positions from that block on), set only
        # by an update that completed a block; lives only from update() to the attention call of the
        # same step; see full().
        self._recent: tuple[int, list[torch.Tensor]] | None = None

    # Public views of the pools and block tables: they first store a parked prefill append (see
    # _DeferredStore), so what they show is complete. The layer's own code uses _pools / _tables.
    @property
    def pools(self) -> list[_BlockPool] | None:
        """K and V :class:`_BlockPool` (None before the first update)."""
        self._deferred.flush()
        return self._pools

    @property
    def tables(self) -> list[torch.Tensor] | None:
        """K and V block tables, int32 ``[B, H, cap_blocks]`` (None before the first update)."""
        self._deferred.flush()
        return self._tables

    def __repr__(self) -> str:
        return f"GAACLayer(layer={self.layer_idx}, tokens={self.get_seq_length()}, block_size={self.geometry.block_size})"

    # -- transformers layer API -------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for name, t in (("keys", key_states), ("values", value_states)):
            if t.dtype != torch.bfloat16:
                raise ValueError(
                    f"GAACCache stores bfloat16 KV losslessly, but the model produced {name} in {t.dtype}: "
                    "load the model with dtype=torch.bfloat16 (or use DynamicCache)"
                )
        b, h, _, d = key_states.shape
        g = self.geometry
        if d != g.head_dim:
            raise ValueError(
                f"layer {self.layer_idx}: KV head_dim {d} does not match the calibration table's {g.head_dim}"
            )
        dev = self.device = key_states.device
        table = self._device_tables.get(_local_heads(self._table, h, self.layer_idx), dev)
        cuda = dev.type == "cuda"
        self._pools = [_BlockPool(g, *table.bases(self.layer_idx, kind), dev, self.triton_codec, b * h,
                                  self._host_slab.take(2) if cuda else None)
                       for kind in (_K, _V)]
        # One column from the start: kernels take the full-capacity table and want max_blocks >= 1.
        self._tables = [torch.zeros(b, h, 1, dtype=torch.int32, device=dev) for _ in (_K, _V)]
        self.tails = [torch.zeros(b, h, g.block_size, d, dtype=torch.bfloat16, device=dev) for _ in (_K, _V)]
        self._heads = torch.arange(h, device=dev)
        # sync terms of a deferred store (4 per pool) land here without blocking (see _DeferredStore)
        self._terms_host = self._terms_event = None
        if dev.type == "cuda":
            self._terms_host = self._host_slab.take(8)
            self._terms_event = torch.cuda.Event()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[B, H, q, D]`` keys/values; return what the model's attention needs (see module doc)."""
        if self._awaiting_attention:
            self._awaiting_attention = False
            raise RuntimeError(
                f"GAAC layer {self.layer_idx}: the previous update() returned only the uncompressed tail, but no "
                "GAAC attention call read the compressed blocks. The model's attention function bypassed "
                "gaac_hf's (config._attn_implementation was a GAAC name?). Pass return_full_kv=True to GAACCache "
                "for attention functions other than gaac_hf.attention.gaac_attention_forward."
            )
        self._recent = self.append(key_states, value_states)
        if self._wants_full_kv():
            kv = self.full_kv()
            self._recent = None
            return kv
        # A fresh view object per call, so the attribute never leaks to another step's tensor.
        k, v = self.tails[_K][:, :, : self.tail_len], self.tails[_V][:, :, : self.tail_len]
        k._gaac_layer = v._gaac_layer = self
        self._awaiting_attention = True
        return k, v

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[int, list[torch.Tensor]] | None:
        """Store ``[B, H, q, D]`` bf16 keys/values: tail first, complete blocks encoded once.

        Returns None when no block completes (everything written since block ``num_blocks`` is in the
        tail: :meth:`full` reads it there, nothing is concatenated). Otherwise ``(nb0, [seq_k, seq_v])``:
        the block count before this call and the uncompressed positions from block ``nb0`` on (old
        tail + new tokens, ``[B, H, tl + q, D]``), so that the attention of this step does not decode
        blocks it has just encoded (see :meth:`full`).
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.dtype != torch.bfloat16 or value_states.dtype != torch.bfloat16:
            raise ValueError(f"GAACCache stores bfloat16 KV, got {key_states.dtype}/{value_states.dtype}")
        b, h, q, _ = key_states.shape
        tails = self.tails
        if b != tails[_K].shape[0]:
            raise ValueError(f"GAAC layer {self.layer_idx}: batch of {b} rows but the cache holds {tails[_K].shape[0]}")
        t, tl, nb0 = self.geometry.block_size, self.tail_len, self.num_blocks
        if tl + q < t:
            # no block completes (every decode step but one in T): the tail holds all of it
            tails[_K][:, :, tl : tl + q].copy_(key_states)
            tails[_V][:, :, tl : tl + q].copy_(value_states)
            self.tail_len = tl + q
            return None
        seqs = [torch.cat([tails[kind][:, :, :tl], new], dim=2) for kind, new in ((_K, key_states), (_V, value_states))]
        nfull = (tl + q) // t
        rem = tl + q - nfull * t
        self._deferred.flush()  # the pools' counters and every table must be current before this append
        self._ensure_table(self.num_blocks + nfull)
        heads = self._heads.view(1, h, 1).expand(b, h, nfull).reshape(-1)
        blocks = [seq[:, :, : nfull * t].reshape(b * h * nfull, t, self.geometry.head_dim) for seq in seqs]
        encs = [p.encode(blk, heads) for p, blk in zip(self._pools, blocks)]
        short, terms = _sync_plan(self._pools, encs)
        args = (encs, blocks, short, terms, self.num_blocks, nfull)
        if terms is not None:  # a prefill: store later, without a sync now (see _DeferredStore)
            if terms.is_cuda:
                self._terms_host[: terms.numel()].copy_(terms, non_blocking=True)
                self._terms_event.record(torch.cuda.current_stream(terms.device))  # the copy's stream
                args = (encs, blocks, short, self._terms_host[: terms.numel()], self.num_blocks, nfull)
            self._deferred.pending = (self, args)
        else:
            self._store_deferred(*args)
        for kind in (_K, _V):
            self.tails[kind][:, :, :rem].copy_(seqs[kind][:, :, nfull * t :])
        self.num_blocks += nfull
        self.tail_len = rem
        return nb0, seqs

    def _store_deferred(self, encs: list, blocks: list, short: list[bool], terms: torch.Tensor | None,
                        nb0: int, nfull: int) -> None:
        """Place encoded K/V blocks ``[nb0, nb0 + nfull)`` of every row and head into the pools and
        their entries into the tables (``terms``: the sync terms of the short pools, on the host
        after a non-blocking copy, or on the device)."""
        if terms is not None and not terms.is_cuda and self._terms_event is not None:
            self._terms_event.synchronize()  # the non-blocking copy into the pinned buffer has landed
        vals = terms.tolist() if terms is not None else []
        res = _reserve_from(self._pools, encs, short, vals)
        b, h = self.tails[_K].shape[:2]
        for kind, (p, e, blk, (ub, new)) in enumerate(zip(self._pools, encs, blocks, res)):
            self._tables[kind][:, :, nb0 : nb0 + nfull] = p.store(e, blk, ub, new).view(b, h, nfull)

    def _wants_full_kv(self) -> bool:
        if self._return_full_kv is not None:
            return self._return_full_kv
        return not _attn.uses_gaac_attention(self._config)

    def _ensure_table(self, blocks: int) -> None:
        # headroom as for the pools (a decode step adds one block per row and head); the kernel's
        # split grid follows the live block count (kernel_view's active_blocks), not the capacity
        self._tables = [_grow(tb, blocks, dim=2, slack=_headroom(blocks, 1)) for tb in self._tables]

    def get_seq_length(self) -> int:
        return self.num_blocks * self.geometry.block_size + self.tail_len if self.is_initialized else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._reset_state()

    def offload(self):  # the pools are the point of this cache; keep them where they are
        pass

    def prefetch(self):
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: rows follow ``beam_idx``; only integers and the tail move."""
        self._recent = None
        if not self.is_initialized:
            return
        self._deferred.flush()
        idx = beam_idx.to(self.device)
        self._tables = [tb.index_select(0, idx) for tb in self._tables]
        self.tails = [tl.index_select(0, idx) for tl in self.tails]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._recent = None
        if not self.is_initialized:
            return
        self._deferred.flush()
        self._tables = [tb.repeat_interleave(repeats, dim=0) for tb in self._tables]
        self.tails = [tl.repeat_interleave(repeats, dim=0) for tl in self.tails]
        self._resize_headroom()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._recent = None
        if not self.is_initialized:
            return
        self._deferred.flush()
        if isinstance(indices, torch.Tensor):
            indices = indices.to(self.device)
        self._tables = [tb[indices] for tb in self._tables]
        self.tails = [tl[indices] for tl in self.tails]
        self._compact()
        self._resize_headroom()

    def _resize_headroom(self) -> None:
        # A decode step finalizes one block per row and head: the raw pool's headroom follows B.
        b, h = self.tails[_K].shape[:2]
        for p in self._pools:
            p.step_blocks = b * h

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (negative). transformers < 5.18 also accepts a
        positive value meaning "keep this many tokens"; later versions reject it, and so do we there.

        Cropping into encoded history decodes the block that becomes incomplete back into the tail.
        """
        tokens_to_remove = int(tokens_to_remove)  # transformers 5.17's assisted decoding passes a 0-d tensor
        self._recent = None
        n = self.get_seq_length()
        if tokens_to_remove > 0:
            if not _POSITIVE_CROP_IS_LENGTH:
                raise ValueError(
                    f"Calling `crop` with a positive value (`{tokens_to_remove}`) is not supported. "
                    "Please use a negative integer to remove that number of tokens from the cache instead."
                )
            if tokens_to_remove >= n:
                return
            new_len = tokens_to_remove
        else:
            new_len = max(n + tokens_to_remove, 0)
        if tokens_to_remove == 0 or not self.is_initialized or new_len == n:
            return
        self._deferred.flush()
        t = self.geometry.block_size
        if new_len >= self.num_blocks * t:
            self.tail_len = new_len - self.num_blocks * t
            return
        keep, rem = divmod(new_len, t)
        if rem:
            b, h = self.tails[_K].shape[:2]
            heads = self._heads.view(1, h).expand(b, h).reshape(-1)
            for kind in (_K, _V):
                blk = self._pools[kind].gather(self._tables[kind][:, :, keep].reshape(-1), heads)
                self.tails[kind][:, :, :rem].copy_(blk.view(b, h, t, -1)[:, :, :rem])
        self.num_blocks, self.tail_len = keep, rem
        self._compact()

    def _compact(self) -> None:
        # Release pool entries no row references any more (after crop or batch selection).
        for kind in (_K, _V):
            live = self._tables[kind][:, :, : self.num_blocks]
            self._tables[kind] = self._tables[kind].clone()
            self._tables[kind][:, :, : self.num_blocks] = self._pools[kind].compact(live)

    # -- reading ----------------------------------------------------------------------------------
    def full_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Decompressed (keys, values), each bf16 ``[B, H, S, D]`` contiguous, bit-exact."""
        k, v = self._full((_K, _V))
        return k, v

    def full(self, kind: int) -> torch.Tensor:
        """Decompressed keys (kind 0) or values (1), bf16 ``[B, H, S, D]`` contiguous.

        Between update() and the attention call of the same step, the positions written by an update
        that completed blocks are taken from its uncompressed input (same bits: the codec is
        lossless) instead of being decoded right after being encoded; a prefill then decodes nothing.
        Every block from an earlier step is decoded from its slot; the tail is read in place.
        """
        return self._full((kind,))[0]

    def _full(self, kinds: tuple[int, ...]) -> list[torch.Tensor]:
        b, h = self.tails[_K].shape[:2]
        t, d = self.geometry.block_size, self.geometry.head_dim
        if self._recent is not None:  # blocks before nb were stored before this step's append
            nb, tails = self._recent[0], [self._recent[1][kind] for kind in kinds]
        else:
            self._deferred.flush()
            nb, tails = self.num_blocks, [self.tails[kind][:, :, : self.tail_len] for kind in kinds]
        if nb == 0:
            return [x.contiguous() for x in tails]
        pools = [self._pools[kind] for kind in kinds]
        if all(p.triton for p in pools):
            # K and V straight through their block tables into the result, tails included, in one
            # launch: no gathered copy of the slots, no select against the raw pool, no concatenation
            # (bit-identical to the gather below)
            out = torch.empty(len(kinds), b, h, nb * t + tails[0].shape[2], d, dtype=torch.bfloat16, device=tails[0].device)
            _decode_tables()([(p.slots, p.heap, p.esc_start, p.raw, self._tables[kind].contiguous(), p.base8, p.base16)
                              for p, kind in zip(pools, kinds)], self.geometry, nb, out, tails)
            return list(out.unbind(0))
        res = []
        heads = self._heads.view(1, h, 1).expand(b, h, nb).reshape(-1)
        for p, kind, tail in zip(pools, kinds, tails):
            blocks = p.gather(self._tables[kind][:, :, :nb].reshape(-1), heads)
            res.append(torch.cat([blocks.view(b, h, nb * t, d), tail], dim=2))
        return res

    def kernel_view(self) -> dict:
        """Keyword arguments of ``gaac_hf.kernels.attention.gaac_decode_attention`` for this layer.

        Pools, full-capacity contiguous tables int32 ``[B, H, cap_blocks]`` (entries past
        ``num_blocks`` are ignored by the kernel), full tail buffers bf16 ``[B, H, T, D]``, bases
        uint8 ``[H, D]`` and ``num_blocks`` / ``tail_len`` as int32 ``[B]`` device tensors (read-only:
        shared with the other layers of the cache that have the same counts, see :class:`_CountsMemo`).
        """
        self._deferred.flush()
        pk, pv = self._pools
        nbt, tlt = self._counts_memo.get(self.tails[_K].shape[0], self.num_blocks, self.tail_len, self.device)
        return {
            "k_slots": pk.slots, "v_slots": pv.slots, "k_heap": pk.heap, "v_heap": pv.heap,
            "k_esc_start": pk.esc_start, "v_esc_start": pv.esc_start, "k_raw": pk.raw, "v_raw": pv.raw,
            "k_table": self._tables[_K], "v_table": self._tables[_V],
            "k_tail": self.tails[_K], "v_tail": self.tails[_V],
            "num_blocks": nbt, "tail_len": tlt,
            "k_base8": pk.base8, "k_base16": pk.base16, "v_base8": pv.base8, "v_base16": pv.base16,
            "geometry": self.geometry,
            # tables keep spare capacity (they grow by doubling): size the kernel's splits by the live blocks
            "active_blocks": max(self.num_blocks, 1),
        }

    # -- statistics -------------------------------------------------------------------------------
    def _stats(self) -> dict:
        """Host-side byte counts plus the pools' device counters (``counts`` [2, 6], not synced here)."""
        if not self.is_initialized:
            z = torch.zeros(6, dtype=torch.int64)
            return {"fixed": 0, "slot_rows": 0, "bf16": 0, "allocated": 0, "counts": [z, z], "encoded": 0,
                    "tail_tokens": 0, "tokens": 0}
        self._deferred.flush()
        b, h = self.tails[_K].shape[:2]
        g = self.geometry
        table_bytes = b * h * self.num_blocks * 4
        tail_bytes = b * h * self.tail_len * g.head_dim * 2
        return {
            "fixed": 2 * (table_bytes + tail_bytes),  # + slot rows and raw rows, counted after the sync
            "slot_rows": sum(p.n_slots for p in self._pools),
            "bf16": 2 * b * h * self.get_seq_length() * g.head_dim * 2,
            "allocated": sum(p.allocated_bytes() for p in self._pools)
            + sum(tb.numel() * 4 for tb in self._tables) + sum(tl.numel() * 2 for tl in self.tails),
            "counts": [p.counts for p in self._pools],
            "encoded": sum(p.encoded_blocks for p in self._pools),
            "tail_tokens": self.tail_len,
            "tokens": self.get_seq_length(),
        }


def _resolve_table(calibration) -> CalibrationTable:
    if isinstance(calibration, CalibrationTable):
        return calibration
    if calibration is None:
        raise ValueError(
            "GAACCache needs calibration=<path to a .safetensors table> or a CalibrationTable "
            "(make one with gaac-calibrate or gaac_hf.calibration)"
        )
    p = Path(calibration)
    if not p.is_absolute() and not p.exists() and (_REPO / p).exists():
        p = _REPO / p  # repo-relative names such as "calibration_data/smollm2-135m.safetensors"
    return CalibrationTable.load(p)


def _layer_types_and_kwargs(config) -> tuple[list[str], list[dict]]:
    # transformers 5.17 returns one kwargs dict for all layers, 5.23+ one dict per layer.
    types, kw = get_layer_types_and_kwargs(config)
    if isinstance(kw, dict):
        kw = [kw] * len(types)
    return list(types), list(kw)


class GAACCache(Cache):
    """Lossless GAAC KV cache for transformers models.

    Example::

        import gaac_hf
        gaac_hf.register()                       # once, before loading: attn_implementation="gaac"
        model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation="gaac")
        cache = gaac_hf.GAACCache(model.config, calibration="calibration_data/smollm2-135m.safetensors")
        out = model.generate(**inputs, past_key_values=cache, cache_implementation=None)
        print(cache.stats())

    Args:
        config: the model's config (pass ``model.config`` itself: its ``_attn_implementation`` is read
            live to decide whether update() returns full K/V or a tail carrier).
        calibration: a :class:`~gaac_hf.calibration.CalibrationTable` or a path to one. It must fit
            the model (``table.check_model``), else ValueError.
        block_size: override the table's block size (the windows do not depend on it).
        return_full_kv: None (default) = automatic from the config; True = always return full K/V
            (any attention function works); False = always return the tail carrier.
        fused: decode steps (q_len == 1) on CUDA. True (default): the fused Triton kernel. ``"auto"``:
            the fused kernel below ``gaac_hf.attention.FUSED_MAX_TOKENS`` cached tokens,
            decode-then-SDPA (SDPA without its cuDNN backend) from there on: less GPU time at long
            contexts on the H200 (Qwen3-8B shape, 64K: 16.7 vs 19.4 ms per step at B=1, 41.8 vs
            63.2 ms at B=4) and less wall time when batched (B=4 64K: 55.2 vs 70.1 ms), ~3 ms more
            wall time per step at B=1 (``eval/results/host_ab_h200_*.json``). It allocates one layer's
            decoded K and V per step (bf16 ``2 x [B, H, S, D]``: 1.07 GB at B=4 64K for that shape).
            False: never (decode + SDPA, bit-identical to sdpa; use it with attention masks that are
            not of the left-padding form).
        triton_codec: on CUDA, encode and decode blocks with the Triton kernels of
            ``gaac_hf.kernels`` (byte- and bit-identical to the reference codec; default). False
            keeps the reference PyTorch codec everywhere.

    Full-attention layers get a :class:`GAACLayer`; sliding-window, chunked, linear and dummy layers
    keep their stock transformers layer (uncompressed).
    """

    def __init__(self, config, calibration=None, *, block_size: int | None = None,
                 return_full_kv: bool | None = None,
                 fused: bool | str = True, triton_codec: bool = True) -> None:
        if fused not in (True, False, "auto"):
            raise ValueError(f'fused must be True, False or "auto", got {fused!r}')
        table = _resolve_table(calibration)
        table.check_model(config)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        g = table.geometry
        geometry = dataclasses.replace(g, block_size=block_size or g.block_size)
        self.geometry = geometry
        self.table = table
        types, kwargs = _layer_types_and_kwargs(text)
        memo = _CountsMemo()  # shared: in a step every GAAC layer asks for the same counts
        deferred = _DeferredStore()  # shared: a prefill's store waits until the next layer's append
        slab = _HostSlab(_HOST_SLOTS_PER_LAYER * len(types))  # shared: one pinned allocation per cache
        on_device = _DeviceTables()  # shared: the table crosses to the GPU once, not 4 copies per layer
        layers = [
            GAACLayer(i, table, geometry, text, return_full_kv, fused, triton_codec, memo, deferred, slab, on_device)
            if lt == "full_attention"
            else DYNAMIC_LAYER_TYPE_MAPPING[lt](**kw)
            for i, (lt, kw) in enumerate(zip(types, kwargs))
        ]
        if not any(isinstance(layer, GAACLayer) for layer in layers):
            raise ValueError("this model has no full-attention layers: GAACCache would compress nothing")
        super().__init__(layers=layers)

    @classmethod
    def from_dynamic_cache(cls, cache: Cache, config, calibration=None, **kwargs) -> "GAACCache":
        """Compress a filled transformers cache (e.g. after a prefill with another attention).

        Full-attention layers are encoded into GAAC layers; the other (sliding-window, linear...)
        layer objects of ``cache`` are taken over as they are. ``kwargs`` go to the constructor.
        """
        new = cls(config, calibration, **kwargs)
        if len(cache.layers) != len(new.layers):
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {len(new.layers)}")
        for i, (src, dst) in enumerate(zip(cache.layers, new.layers)):
            if not isinstance(dst, GAACLayer):
                new.layers[i] = src
            elif getattr(src, "keys", None) is not None and src.keys.numel():
                dst.append(src.keys, src.values)
        return new

    def stats(self, per_layer: bool = False) -> dict:
        """Resident KV bytes against a BF16 cache, compression ratio and mode shares.

        Byte counts are host-side integers; the mode and raw-row counters live on the device and
        are synced once, here. Keys:

        - ``resident_bytes``: bytes of the GAAC layers' data (slot rows with their escape-stream
          offsets, escape streams, raw rows, block tables, tails); ``bf16_bytes``: what a BF16 DynamicCache would hold for the same layers
          and tokens; ``ratio`` = bf16/resident, ``savings`` = 1 - resident/bf16.
        - ``allocated_bytes``: capacity actually reserved (pools and tables grow by doubling, and a
          prefill leaves headroom for the following decode steps); ``resident_bytes`` excludes it.
        - ``stock_layer_bytes``: uncompressed layers kept stock (sliding window etc.).
        - ``mode_shares`` (and ``_k``/``_v``): fraction of encoded groups in 3-bit / 4-bit / raw mode.
        - ``raw_fallback_blocks`` (raw rows held), ``stored_blocks`` (distinct blocks held),
          ``slot_rows`` (slot rows held: every encoded block takes one, a raw fallback's stays
          unused until a compaction drops it), ``escape_bytes`` (escape heap bytes in use),
          ``encoded_blocks`` (encoded since creation);
          ``tail_tokens``, ``seq_length`` (of the first GAAC layer).
        """
        gaac = [(i, layer) for i, layer in enumerate(self.layers) if isinstance(layer, GAACLayer)]
        per = [(i, layer._stats()) for i, layer in gaac]
        dev = next((c.device for _, s in per for c in s["counts"] if c.device.type != "cpu"), torch.device("cpu"))
        counts = torch.stack([torch.stack([c.to(dev) for c in s["counts"]]) for _, s in per]).cpu()  # [L, 2, 6]: one sync
        modes, raw_rows, orphans = counts[..., :3], counts[..., 3].sum(1), counts[..., 4].sum(1)  # [L, 2, 3], [L], [L]
        heap_bytes = counts[..., 5].sum(1)  # [L]
        g = self.geometry
        for j, (_, s) in enumerate(per):
            s["raw_blocks"] = int(raw_rows[j])
            s["blocks"] = s["slot_rows"] - int(orphans[j]) + s["raw_blocks"]
            s["escape_bytes"] = int(heap_bytes[j])
            # a slot row costs its planes and its 8-byte esc_start; streams at their exact length
            s["resident"] = (s["fixed"] + s["slot_rows"] * (g.slot_bytes + 8) + s["escape_bytes"]
                             + s["raw_blocks"] * g.raw_bytes)

        def shares(c: torch.Tensor) -> dict:
            tot = max(int(c.sum()), 1)
            return {"3bit": int(c[MODE_3BIT]) / tot, "4bit": int(c[MODE_4BIT]) / tot, "raw": int(c[MODE_RAW]) / tot}

        resident = sum(s["resident"] for _, s in per)
        bf16 = sum(s["bf16"] for _, s in per)
        stock = 0
        for layer in self.layers:
            if not isinstance(layer, GAACLayer):
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if isinstance(t, torch.Tensor):
                        stock += t.numel() * t.element_size()
        out = {
            "resident_bytes": resident,
            "bf16_bytes": bf16,
            "ratio": bf16 / resident if resident else 0.0,
            "savings": 1 - resident / bf16 if bf16 else 0.0,
            "allocated_bytes": sum(s["allocated"] for _, s in per),
            "stock_layer_bytes": stock,
            "mode_shares": shares(modes.sum((0, 1))),
            "mode_shares_k": shares(modes[:, _K].sum(0)),
            "mode_shares_v": shares(modes[:, _V].sum(0)),
            "raw_fallback_blocks": sum(s["raw_blocks"] for _, s in per),
            "stored_blocks": sum(s["blocks"] for _, s in per),
            "slot_rows": sum(s["slot_rows"] for _, s in per),
            "escape_bytes": sum(s["escape_bytes"] for _, s in per),
            "encoded_blocks": sum(s["encoded"] for _, s in per),
            "tail_tokens": per[0][1]["tail_tokens"],
            "seq_length": per[0][1]["tokens"],
            "block_size": self.geometry.block_size,
            "slot_bytes": self.geometry.slot_bytes,
        }
        if per_layer:
            out["layers"] = [
                {"layer": i, "resident_bytes": s["resident"], "bf16_bytes": s["bf16"],
                 "ratio": s["bf16"] / s["resident"] if s["resident"] else 0.0,
                 "mode_shares_k": shares(modes[j, _K]), "mode_shares_v": shares(modes[j, _V]),
                 "raw_fallback_blocks": s["raw_blocks"]}
                for j, (i, s) in enumerate(per)
            ]
        return out
