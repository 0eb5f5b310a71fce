"""The storage of one kind (K or V) of one layer: slot pool, escape heap and raw pool.

A :class:`_BlockPool` encodes blocks (the Triton codec kernels on CUDA, the reference codec
elsewhere: same bytes), places them without host syncs in decode steps, gathers them back
bit-exact and compacts itself after crop / batch selection. :func:`_sync_plan` and
:func:`_reserve_from` size the pools of a layer's K and V with at most one host sync between them.
"""
from __future__ import annotations

from functools import partial

import torch

from ..codec import append_escapes, decode_blocks, encode_blocks, escape_lengths
from ..format import BlockGeometry
from ..kernels.paged import PagedTensor
from .host import _HostSlab

# The Triton kernels are optional: without Triton every pool uses the reference codec. Any error,
# not only ImportError: a Triton install that cannot initialize must not break the cache.
try:
    from ..kernels.triton import decode as _tdec
    from ..kernels.triton import encode as _tenc
except Exception:  # noqa: BLE001
    _tdec = _tenc = None


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
    if _tenc is None:
        return None
    try:
        _tenc._check_geometry(geometry)
    except NotImplementedError:  # a layout the kernels do not implement: reference codec
        return None

    def enc(x, b8, b16, g):
        # rows as wide as the escape limit: longer streams belong to raw blocks and are never stored
        return _tenc.encode_blocks_triton(x, b8, b16, g, with_tags=True, escape_width=g.escape_limit)

    return enc, _tdec.decode_blocks_triton, _tenc.append_escapes_triton


def decode_tables(parts, geometry: BlockGeometry, num_blocks: int, out: torch.Tensor, tails) -> torch.Tensor:
    """``decode_tables_triton``; only reached by pools that have the Triton kernels."""
    return _tdec.decode_tables_triton(parts, geometry, num_blocks, out, tails)


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
            encode_blocks, partial(decode_blocks, validate=False), append_escapes)
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

    def paged(self, table: torch.Tensor, tail: torch.Tensor) -> PagedTensor:
        """This pool with a block table and tail buffer, as attention and table decoders read it."""
        return PagedTensor(self.slots, self.heap, self.esc_start, self.raw, table, tail, self.base8, self.base16)

    def allocated_bytes(self) -> int:
        return self.slots.numel() + self.esc_start.numel() * 8 + self.heap.numel() + self.raw.numel() * 2


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


