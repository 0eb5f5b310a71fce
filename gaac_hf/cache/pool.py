"""The storage of one kind (K or V) of one layer: slot pool, escape heap and raw pool.

A :class:`_BlockPool` encodes blocks (the Triton codec kernels on CUDA, the reference codec
elsewhere: same bytes), places them without host syncs in decode steps, gathers them back
bit-exact and compacts itself after crop / batch selection. :func:`_sync_plan` and
:func:`_reserve_from` size the pools of a layer's K and V with at most one host sync between them.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import torch

from ..codec import append_escapes, decode_blocks, encode_blocks, escape_lengths
from ..codec.checksum import block_sums, byte_sums, heap_rows, next_starts, raw_sums, structure_problems
from ..format import BlockGeometry
from ..kernels.paged import PagedTensor
from . import reserve
from .host import _HostSlab

# The Triton kernels are optional: without Triton every pool uses the reference codec. Any error,
# not only ImportError: a Triton install that cannot initialize must not break the cache.
try:
    from ..kernels.triton import decode as _tdec
    from ..kernels.triton import encode as _tenc
except Exception:  # noqa: BLE001
    _tdec = _tenc = None


def _grow(t: torch.Tensor, rows: int, dim: int = 0, page: int = 1) -> torch.Tensor:
    """Return ``t`` with at least ``rows`` entries along ``dim``, old contents kept. When it must grow,
    it gets ``rows`` rounded up to a multiple of ``page`` (fixed-size pages, never doubling: the
    capacity exceeds what is asked for by less than one page). On the CPU, growth along dim 0 extends a
    reservation in place (:mod:`gaac_hf.cache.reserve`): the old rows are neither copied nor moved."""
    have = t.shape[dim]
    if rows <= have:
        return t
    shape = list(t.shape)
    shape[dim] = _round_up(rows, max(page, 1))
    if dim == 0 and reserve.enabled(t.device):  # in place, no copy of the history (gaac_hf.cache.reserve)
        return reserve.grow_or_copy(t, shape[0])
    out = torch.empty(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, have).copy_(t)
    out.narrow(dim, have, shape[dim] - have).zero_()  # never read before written; zeroed all the same
    return out


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


#: CUDA pools grow their slot rows in pages of about this many bytes (a growth copies the pool on the
#: device, without a host sync; larger pages mean fewer copies). CPU pools grow by one decode step's
#: blocks (``B * Hkv`` rows), so their capacity is exact.
CUDA_PAGE_BYTES = 2 << 20
#: blocks the reference encoder takes per call (~40 B of intermediates per value: ~2.6 MB at 64 x 64 blocks)
ENCODE_CHUNK = 16
#: blocks the reference decoder takes per call in :meth:`_BlockPool.gather`: its intermediates stay a
#: few MB and in cache (v2 decode steps 1.8x / 1.6x faster at 4K / 8K tokens, 13% slower at 1K:
#: ``eval/results/cpu_formats_smollm2.json``, ``gaac_v2`` vs ``gaac_v2_whole_layer``)
DECODE_CHUNK = 32
#: CPU escape heaps grow in pages of this many bytes.
CPU_HEAP_PAGE = 1024


def _keeps_headroom(device: torch.device) -> bool:
    """Whether pools on ``device`` keep spare raw rows and heap bytes so that decode steps need no
    host sync (CUDA), or size them exactly at every append (CPU, where reading a counter is free)."""
    return device.type == "cuda"


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


class _BlockPool(reserve.DeepcopyReserved):
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
    Decode steps thus run without host syncs.

    Allocation is bounded (``docs/CACHE.md`` "Memory"): slot rows (with ``esc_start``) grow in fixed
    pages (:meth:`slot_page`), the heap keeps at most one page of spare bytes, and the raw pool
    keeps spare rows only on CUDA, where the no-sync decode path needs them (``2 * step_blocks``
    fallbacks and a sink row). On the CPU counters are free to read, so every append sizes the raw
    pool and heap exactly and the raw pool holds no row until a block falls back.
    """

    entry_dtype = torch.int32  # slot row e >= 0, raw row -1 - e

    def __init__(self, geometry: BlockGeometry, base8: torch.Tensor, base16: torch.Tensor, device,
                 triton_codec: bool = True, step_blocks: int = 1, snap: torch.Tensor | None = None,
                 checksums: bool = False) -> None:
        g = self.geometry = geometry
        device = torch.device(device)
        kernels = _triton_codec(geometry, device) if triton_codec else None
        self.triton = kernels is not None
        self._encode, self._decode, self._append_escapes = kernels or (
            encode_blocks, partial(decode_blocks, validate=False), append_escapes)
        self.base8 = base8.to(device)
        self.base16 = base16.to(device)
        # On CUDA the raw pool's last row is a sink: writes of fitting blocks land there in decode
        # steps (no data-dependent shapes, no sync). The heap's last byte is the sink of the stream
        # append (both codecs). Slot rows start empty: a gather of no entries reads nothing.
        self.headroom = _keeps_headroom(device)  # the no-sync (CUDA) storage policy
        self.slots = torch.zeros(0, g.slot_bytes, dtype=torch.uint8, device=device)
        self.esc_start = torch.zeros(0, dtype=torch.int64, device=device)
        self.heap = torch.zeros(1, dtype=torch.uint8, device=device)
        self.raw = torch.zeros(int(self.headroom), g.block_size, g.head_dim, dtype=torch.bfloat16, device=device)
        # Optional per-block checksums (gaac_hf.codec.checksum), written at encode time: one int64 per
        # slot row and per raw row. Structural checks on every CPU decode (free there: the sync costs
        # nothing); CUDA decoders check nothing (a check would sync): cache.verify() checks it all.
        self.sums = torch.zeros(0, dtype=torch.int64, device=device) if checksums else None
        self.raw_sums = torch.zeros(self.raw.shape[0], dtype=torch.int64, device=device) if checksums else None
        self.check_on_decode = not self.headroom and not self.triton
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

    # -- page sizes (the allocation bound of docs/CACHE.md) -----------------------------------------
    def slot_page(self) -> int:
        """Slot rows per page: one decode step's blocks (``step_blocks = B * Hkv``) on the CPU, so the
        capacity is exact (blocks complete for every row and head together); on CUDA the multiple
        of ``step_blocks`` closest to :data:`CUDA_PAGE_BYTES`."""
        step = max(self.step_blocks, 1)
        if not self.headroom:
            return step
        return _round_up(max(CUDA_PAGE_BYTES // (self.geometry.slot_bytes + 8), 1), step)

    def heap_spare(self) -> int:
        """Spare heap bytes a synced append leaves: on CUDA room for two decode steps of streams at the
        escape limit (the no-sync path's bound), on the CPU none (the page rounds it up)."""
        return 2 * self.step_blocks * self.geometry.escape_limit if self.headroom else 0

    def raw_spare(self) -> int:
        """Spare raw rows a synced append leaves: two decode steps of fallbacks plus the sink on CUDA."""
        return 2 * self.step_blocks + 1 if self.headroom else 0

    # -- appending: encode, reserve room (one host sync for several pools at most), store ----------
    def encode(self, blocks: torch.Tensor, heads: torch.Tensor):
        """Encode bf16 ``[N, T, D]`` blocks (``heads`` int64 ``[N]``) with this pool's windows. The
        reference encoder holds ~40 bytes of int32 intermediates per value: a prefill's blocks are
        encoded :data:`ENCODE_CHUNK` at a time so that they stay small beside the model's own
        activations (``tests/test_cache_memory.py``: generate()'s peak below DynamicCache's); the bytes are the same."""
        n = blocks.shape[0]
        if self.triton or n <= ENCODE_CHUNK:
            return self._encode(blocks, self.base8[heads], self.base16[heads], self.geometry)
        parts = [self._encode(blocks[i : i + ENCODE_CHUNK], self.base8[heads[i : i + ENCODE_CHUNK]],
                              self.base16[heads[i : i + ENCODE_CHUNK]], self.geometry) for i in range(0, n, ENCODE_CHUNK)]
        return type(parts[0])(*(torch.cat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(parts[0])))

    def _has_headroom(self, n: int) -> bool:
        """Whether ``n`` more blocks surely fit (raw rows and escape streams) without reading the
        device counters; refreshes the host bounds from the last non-blocking snapshot first."""
        if not self.headroom:
            return False  # exact sizes at every append: reading the counters costs nothing here
        if self._snap_event is None:  # the no-sync policy on the CPU (tests): counters free to read
            self.n_raw, self.n_heap = int(self.counts[3]), int(self.counts[5])
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
        self.raw = _grow(self.raw, cur + new + self.raw_spare())
        self.heap = _grow(self.heap, used + add + self.heap_spare() + 1, page=1 if self.headroom else CPU_HEAP_PAGE)
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
        if self.sums is not None:
            sums, rsums = block_sums(enc.slots, enc.escapes, enc.escape_len), raw_sums(blocks)
            self.raw_sums = _grow(self.raw_sums, self.raw.shape[0])
        start = self._append_escapes(enc, self.heap, self.counts[5:6])  # int64 [N]; streams of fitting blocks
        raw_pos = self.counts[3] + torch.cumsum(nfit, 0) - 1  # int64 [N], valid where ~fits
        if new is None:
            # No sync (decode steps): every block takes the next slot row, a raw fallback's row stays
            # unused; every block is copied to the raw pool, fitting ones into the sink row.
            page = self.slot_page()
            self.slots = _grow(self.slots, s0 + n, page=page)
            self.esc_start = _grow(self.esc_start, s0 + n, page=page)
            self.slots[s0 : s0 + n] = enc.slots
            self.esc_start[s0 : s0 + n] = start
            slot_pos = torch.arange(s0, s0 + n, device=fits.device)
            sink = torch.full_like(raw_pos, self.raw.shape[0] - 1)
            self.raw.index_copy_(0, torch.where(fits, sink, raw_pos), blocks)
            if self.sums is not None:
                self.sums = _grow(self.sums, self.slots.shape[0], page=page)
                self.sums[s0 : s0 + n] = sums
                self.raw_sums.index_copy_(0, torch.where(fits, sink, raw_pos), rsums)
            self.counts[4] += nfit.sum()
            self.n_slots = s0 + n
        else:
            # Synced anyway (prefill, or the headroom ran out): store compactly.
            n_fit = n - new
            page = self.slot_page()
            self.slots = _grow(self.slots, s0 + n_fit, page=page)
            self.esc_start = _grow(self.esc_start, s0 + n_fit, page=page)
            self.slots[s0 : s0 + n_fit] = enc.slots if new == 0 else enc.slots[fits]
            self.esc_start[s0 : s0 + n_fit] = start if new == 0 else start[fits]
            slot_pos = s0 + torch.cumsum(fits, 0) - 1
            if new:
                self.raw[ub - new : ub] = blocks[nfit]
            if self.sums is not None:
                self.sums = _grow(self.sums, self.slots.shape[0], page=page)
                self.sums[s0 : s0 + n_fit] = sums if new == 0 else sums[fits]
                if new:
                    self.raw_sums[ub - new : ub] = rsums[nfit]
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
        if self.slots.shape[0] == 0:  # no block fitted yet: every entry is raw
            return self.raw[-e - 1]
        # Raw entries decode a slot row too (discarded below): no data-dependent shapes, no syncs.
        s = e.clamp(min=0)
        if self.check_on_decode:
            self._raise_if(self.structure(e[e >= 0]))
        if self.triton or e.shape[0] <= DECODE_CHUNK:
            out = self._decode(self.slots[s], (self.heap, self.esc_start[s]), self.base8[heads], self.base16[heads], g)
        else:  # the reference decoder's intermediates, like the encoder's (:meth:`encode`), a chunk at a time
            out = torch.empty(e.shape[0], g.block_size, g.head_dim, dtype=torch.bfloat16, device=self.slots.device)
            for i in range(0, e.shape[0], DECODE_CHUNK):
                c = s[i : i + DECODE_CHUNK]
                out[i : i + DECODE_CHUNK] = self._decode(self.slots[c], (self.heap, self.esc_start[c]),
                                                         self.base8[heads[i : i + DECODE_CHUNK]],
                                                         self.base16[heads[i : i + DECODE_CHUNK]], g)
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
        heap = torch.zeros(total + self.heap_spare() + 1, dtype=torch.uint8, device=flat.device)
        heap[:total] = self.heap[src]
        self.heap = heap
        self.esc_start = new_start
        self.slots = self.slots[s_used]
        if self.sums is not None:
            self.sums = self.sums[s_used]
            self.raw_sums = torch.cat([self.raw_sums[r_used], self.raw_sums[-1:]]) if self.headroom else self.raw_sums[r_used]
        # keeps the CUDA sink row last
        self.raw = torch.cat([self.raw[r_used], self.raw[-1:]]) if self.headroom else self.raw[r_used]
        self.n_slots, self.n_raw, self.n_heap = int(s_used.numel()), int(r_used.numel()), total
        self.counts[3] = self.n_raw
        self.counts[4] = 0
        self.counts[5] = total
        new = torch.where(flat >= 0, s_map[flat.clamp(min=0)], -r_map[(-flat - 1).clamp(min=0)] - 1)
        return new.to(torch.int32).reshape(live.shape)

    def paged(self, table: torch.Tensor, tail: torch.Tensor) -> PagedTensor:
        """This pool with a block table and tail buffer, as attention and table decoders read it. The
        kernels want at least one slot and raw row: an empty one is handed over as a zero row (a
        transient of one block; the table never points at it)."""
        slots, esc_start, raw = self.slots, self.esc_start, self.raw
        if slots.shape[0] == 0:
            slots, esc_start = slots.new_zeros(1, slots.shape[1]), esc_start.new_zeros(1)
        if raw.shape[0] == 0:
            raw = raw.new_zeros(1, *raw.shape[1:])
        return PagedTensor(slots, self.heap, esc_start, raw, table, tail, self.base8, self.base16)

    def allocated_bytes(self) -> int:
        """Bytes this pool's tensors hold, capacity included (a reservation's view page-rounded)."""
        held = (self.slots, self.esc_start, self.heap, self.raw) + (() if self.sums is None else (self.sums, self.raw_sums))
        return sum(reserve.held_bytes(t) for t in held)

    # -- integrity ----------------------------------------------------------------------------------
    def structure(self, rows: torch.Tensor) -> list[str]:
        """Structural problems of slot rows ``rows`` (int64): reserved tags, stream lengths that do not
        match the offsets (see :func:`gaac_hf.codec.checksum.structure_problems`)."""
        if rows.numel() == 0:
            return []
        ends = next_starts(self.esc_start[: self.n_slots], self.counts[5])
        return structure_problems(self.slots[rows], self.esc_start[rows], ends[rows], self.geometry)

    @staticmethod
    def _raise_if(problems: list[str]) -> None:
        if problems:
            raise ValueError("corrupt GAAC cache: " + "; ".join(problems))

    def verify(self, entries: torch.Tensor) -> dict:
        """Check the blocks that table ``entries`` (int, any shape) reference: structure always, the
        checksums written at encode time when the pool keeps them. Raises ValueError naming what is
        wrong; returns counts of what was checked."""
        e = entries.reshape(-1).to(torch.int64)
        rows, raws = torch.unique(e[e >= 0]), torch.unique(-e[e < 0] - 1)
        if bool((rows >= self.n_slots).any()) or bool((raws >= self.raw.shape[0]).any()):
            self._raise_if([f"block-table entries past the pools ({self.n_slots} slot rows, {self.raw.shape[0]} raw rows)"])
        problems = self.structure(rows)
        if self.sums is not None and not problems:
            g = self.geometry
            lens = escape_lengths(self.slots[rows], g)
            got = byte_sums(self.slots[rows]) + byte_sums(heap_rows(self.heap, self.esc_start[rows], g.escape_limit),
                                                           g.slot_bytes, lens)
            bad = (got != self.sums[rows]).nonzero().flatten()
            rbad = (raw_sums(self.raw[raws]) != self.raw_sums[raws]).nonzero().flatten()
            if bad.numel():
                problems.append(f"checksum mismatch in slot rows {rows[bad][:8].tolist()} (planes, tags or escape stream)")
            if rbad.numel():
                problems.append(f"checksum mismatch in raw rows {raws[rbad][:8].tolist()}")
        self._raise_if(problems)
        return {"slot_rows": int(rows.numel()), "raw_rows": int(raws.numel()), "checksums": self.sums is not None}


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


