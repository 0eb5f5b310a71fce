"""The format v3 storage of one kind (K or V) of one layer: one byte pool of variable-length blocks.

A :class:`_BlockPoolV3` keeps the interface of :class:`~gaac_hf.cache.pool._BlockPool` that
:class:`~gaac_hf.cache.layer.GAACLayer` uses (encode, store, gather, compact, paged, verify), so the
layer's bookkeeping (tail, tables, crop, reorder, batch selection) is the same for both formats.

Storage (``docs/FORMAT_V3.md`` "Block table, pool, paging"): ``pool`` uint8 ``[cap]`` holds the blocks
back to back at 16-byte aligned offsets, each at its exact stored length (a compressed block, or its
BF16 bytes when it does not fit); table entries are int64 ``offset | 1`` for a BF16 block. ``used``
bytes are taken; at least ``PagedTensorV3.GUARD_BYTES`` readable bytes follow the last block. The
pool grows in fixed pages (:meth:`page_bytes`), never by doubling: ``cap - used < page + GUARD_BYTES``.

Codec: on the CPU the C++ library of :mod:`gaac_hf.kernels.cpu` (built from the one v3 core, same
bytes as the reference), else the PyTorch reference :mod:`gaac_hf.codec.v3`; on CUDA the v3 CUDA
codec (``kernels/cuda/codec_v3.py``) when it loads, else the reference.

Host syncs: a pool with the CUDA codec stores a decode step's blocks without any (``sync_free``):
block offsets are computed on the device from the encoded lengths (:class:`_UsedBound` keeps the bytes
in use in a device counter and, on the host, an upper bound that never waits: the exact value as of
the last store whose non-blocking snapshot has landed, plus the worst case, BF16 size, of every block
stored since); the pool grows by pages when that bound needs it. A store of more than a page of worst
case (a prefill) is sized exactly instead: one host sync, so a prefill never leaves its worst case
reserved. The counters (modes, raw blocks) stay on the device until ``stats()``. Allocated bytes exceed
the bytes in use by less than two pages (one of slack, one of a decode step's worst-case excess while
its snapshot is in flight) + the guard. Reading ``used`` / ``n_slots`` syncs (stats, verify, compact
do). The reference codec on CUDA sizes every store on the host (one sync each).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codec.checksum import byte_sums
from ..codec.v3 import EncodedBlocksV3, decode_pool_v3, encode_blocks_v3, pack_blocks
from ..format.v3 import ALIGN, ENTRY_RAW, GeometryV3
from ..kernels.cpu import native
from ..kernels.paged import PagedTensorV3
from . import reserve

GUARD = PagedTensorV3.GUARD_BYTES
#: CPU pools grow in pages of at least this many bytes (and at least one decode step's worst case)
CPU_PAGE_BYTES = 16 << 10
#: CPU pools place blocks at device offsets too (``sync_free``) when True: graph-mode decode steps
#: (gaac_hf.cache.graphs) need that; tests set it to run those steps on the CPU
CPU_SYNC_FREE = False


def default_format(device: torch.device, head_dim: int | None = None, group: int | None = None,
                   group_axis: str = "channel") -> int:
    """The storage format a cache built without ``format_version`` uses on ``device``: 4 where the fused
    v4 register-tile kernel serves the layer (Hopper with the ``cuda`` extra, head_dim 64/128/256, up to 16
    query heads per kv head, 8 at 256: :func:`gaac_hf.cache.fused_v3.why_unavailable`): the format whose
    decode steps beat cuDNN on the H200 (``eval/results/attention_h200.json``, ``e2e_h200.json``), at ~1.30x
    instead of v3's ~1.42x. Else 3 where the fused v3 kernel serves it. On the CPU 3 where the CPU library
    loads (:mod:`gaac_hf.kernels.cpu`: its C++ v3 decoder makes decode + SDPA 7-22x faster than v2's
    PyTorch decoder, bit-identical to DynamicCache + sdpa all the same: ``eval/results/cpu_formats_smollm2.json``).
    2 elsewhere (other GPUs run the v2 Triton kernels; token-axis tables are v2 only). Pass
    ``format_version=3`` to keep v3's ratio on Hopper."""
    from .fused_v3 import why_unavailable

    if group_axis != "channel":
        return 2
    if why_unavailable(device, head_dim, group, 4) is None:
        return 4
    if why_unavailable(device, head_dim, group) is None:
        return 3
    return 3 if torch.device(device).type == "cpu" and native.available() else 2


def geometry_v3(geometry) -> GeometryV3:
    """The v3 geometry of a (v2) calibration table's :class:`~gaac_hf.format.BlockGeometry`: same block
    size and head_dim; the windows mean the same in both formats. Token-axis tables are refused."""
    if getattr(geometry, "group_axis", "channel") != "channel":
        raise ValueError("format_version=3 groups along channels only: this calibration table groups along tokens "
                         "(use format_version=2, or calibrate a channel-axis table)")
    return GeometryV3(block_size=geometry.block_size, head_dim=geometry.head_dim)


def _cuda_codec():
    """The v3 CUDA codec module, or None (not importable or no usable toolchain)."""
    try:
        from ..kernels.cuda import codec_v3
    except Exception:  # noqa: BLE001 - an optional backend must never break the cache
        return None
    return codec_v3 if codec_v3.why_unavailable() is None else None


@dataclass
class _EncodedV3:
    """Encoded blocks: rows uint8 ``[N, 2*T*D]``, nbytes int32 ``[N]``, fits bool ``[N]``, modes int64
    ``[3]`` (groups in 3-bit / 4-bit / raw mode over the N blocks)."""

    rows: torch.Tensor
    nbytes: torch.Tensor
    fits: torch.Tensor
    modes: torch.Tensor


def _u32_at(pool: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """int64 little-endian u32 at byte offsets ``offs`` (int64 [N]) of a uint8 pool."""
    idx = offs[:, None] + torch.arange(4, device=offs.device)
    b = pool[idx].to(torch.int64)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


class _UsedBound:
    """Bytes in use of a sync-free pool: exact in a device counter, bounded on the host without waiting.

    Each store adds its blocks' worst case (``worst``) to a host total and copies (used, raw blocks,
    stored blocks) to a pinned buffer without blocking; once that copy has landed (CUDA event) its
    values are known exactly. ``bound()`` = exact used at the last landed snapshot + worst case of every
    store after it, so it is never below the device value. On the CPU a snapshot lands at once, or
    ``lag`` look-ups later (tests exercise the bound with it).
    """

    def __init__(self, device: torch.device, lag: int = 0) -> None:
        self.device = device
        self.dev = torch.zeros(1, dtype=torch.int64, device=device)  # exact bytes in use
        self.worst = 0  # host: sum of every store's worst case
        self.known = (0, 0, 0)  # (used, raw blocks, blocks) exact as of a landed snapshot
        self.known_worst = 0  # self.worst when that snapshot was taken
        cuda = device.type == "cuda"
        self.buf = torch.zeros(3, dtype=torch.int64, pin_memory=cuda)
        self.pending = None  # CUDA event, or on the CPU the look-ups left before it lands
        self.pending_worst = 0
        self.lag = lag

    def bound(self) -> int:
        self.land()
        return self.known[0] + self.worst - self.known_worst

    def land(self) -> None:
        if self.pending is None:
            return
        if isinstance(self.pending, int):
            if self.pending > 0:
                self.pending -= 1
                return
        elif not self.pending.query():
            return
        self.known, self.known_worst, self.pending = tuple(self.buf.tolist()), self.pending_worst, None

    def after_store(self, worst: int, raw: torch.Tensor, blocks: int) -> None:
        """Account a store of worst case ``worst`` bytes (the device counter already advanced);
        ``raw``: the device count of raw blocks after it."""
        self.worst += worst
        vals = torch.cat([self.dev, raw.reshape(1), torch.full((1,), blocks, dtype=torch.int64, device=self.device)])
        if self.device.type == "cuda":
            self.buf.copy_(vals, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self.pending = ev
        else:
            self.buf.copy_(vals)
            self.pending = self.lag if self.pending is None else self.pending
        self.pending_worst = self.worst

    def set_exact(self, used: int, raw: int, blocks: int, worst: int) -> None:
        """The values after a store of worst case ``worst`` that the host read exactly (one sync)."""
        self.known, self.known_worst, self.pending = (used, raw, blocks), self.worst + worst, None

    def reset(self, used: int, raw: int, blocks: int) -> None:
        """After a host-side rebuild (compact): the exact values are known."""
        self.dev.fill_(used)
        self.known, self.known_worst, self.pending = (used, raw, blocks), self.worst, None


class _BlockPoolV3(reserve.DeepcopyReserved):
    """Encoded blocks of one kind (K or V) of one layer in format v3 (see the module docstring).

    base8, base16: uint8 ``[H, D]`` windows of this layer and kind.
    """

    entry_dtype = torch.int64
    triton = False  # the layer's v2 table-decode fast path does not apply

    def __init__(self, geometry: GeometryV3, base8: torch.Tensor, base16: torch.Tensor, device,
                 step_blocks: int = 1, checksums: bool = False, consts: tuple | None = None,
                 sync_free: bool | None = None, snapshot_lag: int = 0) -> None:
        self.geometry = geometry
        self.device = torch.device(device)
        self.base8, self.base16 = base8.to(self.device), base16.to(self.device)
        # int32 [H, D/2] pair constants; ``consts``: precomputed (a layer passes its slice of the table's)
        self.b8p, self.dbp = consts if consts is not None else PagedTensorV3.pair_constants(self.base8, self.base16)
        self.native = self.device.type == "cpu" and native.available()
        self.cuda = _cuda_codec() if self.device.type == "cuda" else None
        self.pool = torch.zeros(GUARD, dtype=torch.uint8, device=self.device)
        # no host sync per store where the codec can place blocks at device offsets (module docstring);
        # on the CPU (exact sizes are free there) only when asked, which tests do
        if sync_free is None:
            sync_free = self.cuda is not None or (CPU_SYNC_FREE and self.native)
        if sync_free and not (self.native or self.cuda is not None):
            raise ValueError("sync_free needs the CPU library or the CUDA codec (a pack at device offsets)")
        self.bound = _UsedBound(self.device, snapshot_lag) if sync_free else None
        self._used = 0
        self.step_blocks = step_blocks
        # groups per mode (3-bit, 4-bit, raw), blocks stored as BF16, 0, 0 (the v2 pools' counter layout);
        # on the device for a sync-free pool
        self.counts = torch.zeros(6, dtype=torch.int64, device=self.device if sync_free else "cpu")
        self.encoded_blocks = 0
        self.n_blocks = 0  # blocks in the pool
        # optional per-block checksums: one int64 per stored block, found by its offset
        sums_dev = self.device if sync_free else "cpu"
        self.sums = torch.zeros(0, dtype=torch.int64, device=sums_dev) if checksums else None
        self.sum_offs = torch.zeros(0, dtype=torch.int64, device=sums_dev) if checksums else None

    @property
    def sync_free(self) -> bool:
        return self.bound is not None

    @property
    def used(self) -> int:
        """Bytes in use (exact; on a sync-free pool reading it syncs the host)."""
        return int(self.bound.dev) if self.bound is not None else self._used

    @used.setter
    def used(self, value: int) -> None:
        if self.bound is not None:
            raise AttributeError("a sync-free pool's bytes in use advance on the device")
        self._used = value

    def snapshot(self) -> tuple[int, int, int]:
        """(bytes in use, raw blocks, stored blocks), exact as of the last store whose values reached
        the host (all of them on the CPU or without ``sync_free``); never waits."""
        if self.bound is None:
            return self._used, int(self.counts[3]), self.n_blocks
        self.bound.land()
        return self.bound.known

    # -- the v2 pool protocol the layer drives (no deferred store: sizes are known right away) -------
    @property
    def n_slots(self) -> int:
        return self.n_blocks - int(self.counts[3])

    def _has_headroom(self, n: int) -> bool:
        return True

    def _reserve_bound(self, n: int) -> tuple[int, None]:
        return 0, None

    def page_bytes(self) -> int:
        """Pool growth step: one decode step's blocks at their largest (BF16) size, at least
        :data:`CPU_PAGE_BYTES`, a multiple of 4 KiB. (A CPU pool in a reservation ends at the next OS
        page instead: :meth:`_room_exact`.)"""
        want = max(self.step_blocks * self.geometry.raw_bytes, CPU_PAGE_BYTES)
        return -(-want // 4096) * 4096

    def _room_bound(self, worst: int) -> None:
        """Sync-free pools: room for ``worst`` more bytes past the host bound of the bytes in use (the
        whole old pool is copied: its bytes past the device count are the zeros of the guard)."""
        bound = self.bound.bound()
        need = bound + worst + GUARD
        have = self.pool.numel()
        if need <= have:
            return
        page = self.page_bytes()
        cap = bound + GUARD + -(-(need - bound - GUARD) // page) * page
        if reserve.enabled(self.device):  # CPU: in place (gaac_hf.cache.reserve)
            self.pool = reserve.grow_or_copy(self.pool, cap)
            return
        pool = torch.empty(cap, dtype=torch.uint8, device=self.device)
        pool[:have] = self.pool
        pool[have:].zero_()
        self.pool = pool

    def _room(self, total: int) -> None:
        """Make room for ``total`` more bytes, which the caller writes at ``used`` right away: a new
        pool is zeroed only past them (the guard and the page's slack), not filled twice."""
        self._room_exact(self.used, total)

    def _room_exact(self, used: int, total: int) -> None:
        need = used + total + GUARD
        if need <= self.pool.numel():
            return
        if reserve.enabled(self.device):  # CPU: in place (gaac_hf.cache.reserve); the bytes past used are zero
            self.pool[used:].zero_()
            # a reservation holds whole pages, and growing one copies nothing: end the pool at the next page
            # boundary past the guard (a coarser step would only hold bytes: 16 KiB per pool is more than a
            # short prompt's K/V)
            self.pool = reserve.grow_or_copy(self.pool, -(-need // reserve.PAGE) * reserve.PAGE)
            return
        page = self.page_bytes()
        cap = used + GUARD + -(-(need - used - GUARD) // page) * page
        pool = torch.empty(cap, dtype=torch.uint8, device=self.device)
        pool[:used] = self.pool[:used]
        pool[used + total :].zero_()
        self.pool = pool

    # -- encode and store ------------------------------------------------------------------------
    def encode(self, blocks: torch.Tensor, heads: torch.Tensor) -> _EncodedV3:
        """Encode bf16 ``[N, T, D]`` blocks (``heads`` int64 ``[N]``) with this pool's windows."""
        g = self.geometry
        b8, b16 = self.base8[heads], self.base16[heads]
        if self.native:
            rows, nbytes = native.encode_v3(blocks, b8, b16, g)
        elif self.cuda is not None:
            enc = self.cuda.encode_blocks_cuda(blocks.contiguous(), b8, b16, g)
            rows, nbytes = enc.data, enc.nbytes
        else:
            enc = encode_blocks_v3(blocks, b8, b16, g)
            rows, nbytes = enc.data, enc.nbytes
        fits = nbytes <= g.raw_bytes
        seg = _u32_at(rows.reshape(-1), torch.arange(rows.shape[0], device=rows.device) * g.raw_bytes
                      + g.segtab_offset + 4 * g.segments)
        wide, raw = (seg & 0xFFFF).sum(), (seg >> 16).sum()
        modes = torch.stack([rows.shape[0] * g.groups - wide, wide - raw, raw])
        if self.bound is None:
            modes = modes.cpu()
        return _EncodedV3(rows, nbytes, fits, modes)

    def store(self, enc: _EncodedV3, blocks: torch.Tensor, ub: int = 0, new=None) -> torch.Tensor:
        """Place encoded blocks at the end of the pool; returns their int64 table entries ``[N]``."""
        g = self.geometry
        n = blocks.shape[0]
        lens = torch.where(enc.fits, enc.nbytes.to(torch.int64), g.raw_bytes)
        if self.bound is not None:
            return self._store_sync_free(enc, blocks, lens)
        offs = self.used + torch.cumsum(lens, 0) - lens
        total = int(lens.sum())  # the host sync of a CUDA v3 store
        self._room(total)
        if self.native:
            native.pack_v3(enc.rows, enc.nbytes, blocks, offs, self.pool, g)
        else:
            data, _ = pack_blocks(EncodedBlocksV3(enc.rows, enc.nbytes, enc.fits, None), blocks)
            self.pool[self.used : self.used + total] = data
        if self.sums is not None:
            src = torch.where(enc.fits[:, None], enc.rows, blocks.reshape(n, -1).contiguous().view(torch.uint8).reshape(n, -1))
            self.sums = torch.cat([self.sums, byte_sums(src, 0, lens).cpu()])
            self.sum_offs = torch.cat([self.sum_offs, offs.cpu()])
        self.used += total
        self.n_blocks += n
        self.encoded_blocks += n
        self.counts[:3] += enc.modes
        self.counts[3] += int((~enc.fits).sum())
        return offs + torch.where(enc.fits, 0, ENTRY_RAW)

    def _store_sync_free(self, enc: _EncodedV3, blocks: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """:meth:`store` without a host sync: offsets from the device counter, growth from the bound."""
        g = self.geometry
        n = blocks.shape[0]
        worst = n * g.raw_bytes
        if worst > self.page_bytes():
            # more than a decode step's blocks (a prefill): reserving the worst case would leave up to
            # ~30% of the prefill's BF16 bytes unused until a snapshot lands, so size it exactly (one sync)
            used, total, raw = torch.stack([self.bound.dev[0], lens.sum(), self.counts[3] + (~enc.fits).sum()]).tolist()
            self._room_exact(used, total)
            self.bound.set_exact(used + total, raw, self.n_blocks + n, worst)
        else:
            self._room_bound(worst)
        offs, entries = self._place(enc, blocks, lens)
        if self.sums is not None:
            src = torch.where(enc.fits[:, None], enc.rows, blocks.reshape(n, -1).contiguous().view(torch.uint8).reshape(n, -1))
            self.sums = torch.cat([self.sums, byte_sums(src, 0, lens)])
            self.sum_offs = torch.cat([self.sum_offs, offs])
        self.n_blocks += n
        self.encoded_blocks += n
        self.bound.after_store(n * g.raw_bytes, self.counts[3], self.n_blocks)
        return entries

    def _place(self, enc: _EncodedV3, blocks: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The device part of a sync-free store: blocks packed at the device counter, the counter and
        the mode counts advanced. No growth and no host bookkeeping, so a CUDA graph can capture it
        (:meth:`graph_store`). Returns (offsets int64 ``[N]``, table entries int64 ``[N]``)."""
        g = self.geometry
        n = blocks.shape[0]
        ends = self.bound.dev + torch.cumsum(lens, 0)
        offs = ends - lens
        if self.native:
            if n and int(ends[-1]) + GUARD > self.pool.numel():  # on the CPU the exact end is free to check
                raise RuntimeError(f"GAAC v3 pool: the host bound sized {self.pool.numel()} bytes for {int(ends[-1])} + guard")
            native.pack_v3(enc.rows, enc.nbytes, blocks, offs, self.pool, g)
        else:
            self.cuda.pack_blocks_cuda(enc.rows, enc.nbytes, blocks, offs, self.pool, g)
        if n:
            self.bound.dev.copy_(ends[-1:])
        self.counts[:3] += enc.modes
        self.counts[3] += (~enc.fits).sum()
        return offs, offs + torch.where(enc.fits, 0, ENTRY_RAW)

    # -- CUDA-graph decode steps (gaac_hf.cache.graphs) --------------------------------------------
    def graph_reserve(self, blocks: int) -> None:
        """Room for ``blocks`` more blocks at their worst case (BF16 size) past the host bound, so that
        the graph-mode stores of a decode horizon never grow (reallocate) the pool."""
        if self.bound is None or self.sums is not None:
            raise RuntimeError("CUDA-graph decode steps need a sync-free pool without checksums")
        self._room_bound(blocks * self.geometry.raw_bytes)

    def graph_store(self, enc: _EncodedV3, blocks: torch.Tensor) -> torch.Tensor:
        """:meth:`store` of one decode step's blocks inside a captured graph: device work only, into
        room :meth:`graph_reserve` made; the host accounts it later with :meth:`graph_stored`."""
        lens = torch.where(enc.fits, enc.nbytes.to(torch.int64), self.geometry.raw_bytes)
        return self._place(enc, blocks, lens)[1]

    def graph_stored(self, n: int) -> None:
        """Host bookkeeping of ``n`` blocks that a graph-mode step stored: block counts, and their
        worst case added to the host bound (no snapshot is taken during graph replays)."""
        self.n_blocks += n
        self.encoded_blocks += n
        self.bound.worst += n * self.geometry.raw_bytes

    # -- reading ---------------------------------------------------------------------------------
    def gather(self, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Decode table entries int64 ``[N]`` (``heads`` int64 ``[N]``) -> bf16 ``[N, T, D]``, bit-exact.
        On the CPU every block's structure is checked (ValueError when corrupt)."""
        used = self.pool.numel() - GUARD if self.bound is not None else self._used  # the CUDA / CPU decoders do not read it
        return self.decode_from(self.pool, used, entries, heads)

    def decode_from(self, pool: torch.Tensor, used: int, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """:meth:`gather` from another byte pool (uint8 ``[P]``, blocks in its first ``used`` bytes and
        ``GUARD`` readable bytes past each block) with this pool's windows and codec."""
        g = self.geometry
        e = entries.to(torch.int64).contiguous()  # kernels read raw pointers (a table column is strided)
        if e.numel() == 0:
            return torch.empty(0, g.block_size, g.head_dim, dtype=torch.bfloat16, device=self.device)
        if self.native:
            return native.decode_v3(pool, used, e, heads.to(torch.int64).contiguous(), self.b8p, self.dbp, g)
        if self.cuda is not None:
            return self.cuda.decode_pool_cuda(pool, e, self.base8[heads], self.base16[heads], g)
        try:
            return decode_pool_v3(pool[:used], e, self.base8[heads], self.base16[heads], g,
                                  validate=self.device.type == "cpu")
        except ValueError as err:
            raise ValueError(f"corrupt GAAC cache: {err}") from None

    def block_lengths(self, entries: torch.Tensor) -> torch.Tensor:
        """int64 stored length of each block that table ``entries`` (int64 ``[N]``) point at."""
        g = self.geometry
        raw = (entries & ENTRY_RAW).bool()
        start = entries & ~(ALIGN - 1)
        seg = _u32_at(torch.cat([self.pool, self.pool.new_zeros(g.raw_bytes)]), start + g.segtab_offset + 4 * g.segments)
        n_ent, n_raw = seg & 0xFFFF, seg >> 16
        comp = (((g.entry_offset + 2 * n_ent + 3) // 4) * 4 + 4 * n_raw + ALIGN - 1) // ALIGN * ALIGN
        return torch.where(raw, g.raw_bytes, comp)

    def compact(self, live: torch.Tensor) -> torch.Tensor:
        """Drop blocks no table references. ``live``: int64 entries in use (any shape); returns them
        renumbered into the compacted pool (same shape). Host syncs; only after crop / batch selection."""
        flat = live.reshape(-1).to(torch.int64).contiguous()  # a column of a table reshapes to a strided view
        keep = torch.unique(flat)  # sorted: blocks keep their order
        lens = self.block_lengths(keep) if keep.numel() else keep
        new_off = torch.cumsum(lens, 0) - lens
        total = int(lens.sum()) if keep.numel() else 0
        owner = torch.repeat_interleave(torch.arange(keep.numel(), device=flat.device), lens)
        src = (keep & ~(ALIGN - 1))[owner] + torch.arange(total, device=flat.device) - new_off[owner]
        pool = torch.zeros(total + GUARD, dtype=torch.uint8, device=self.device)
        pool[:total] = self.pool[src]
        if self.sums is not None:
            at = torch.searchsorted(self.sum_offs, (keep & ~(ALIGN - 1)).to(self.sum_offs.device))
            self.sums, self.sum_offs = self.sums[at], new_off.to(self.sum_offs.device)
        raw_left = int((keep & ENTRY_RAW).sum()) if keep.numel() else 0
        self.pool, self.n_blocks = pool, int(keep.numel())
        self.counts[3] = raw_left
        if self.bound is not None:
            self.bound.reset(total, raw_left, self.n_blocks)
        else:
            self._used = total
        renumbered = new_off + (keep & ENTRY_RAW)
        return renumbered[torch.searchsorted(keep, flat)].reshape(live.shape)

    def paged(self, table: torch.Tensor, tail: torch.Tensor) -> PagedTensorV3:
        """This pool with a block table (int64) and tail buffer, as attention kernels read it."""
        return PagedTensorV3(self.pool, table, tail, self.b8p, self.dbp)

    def allocated_bytes(self) -> int:
        """Bytes this pool's tensors hold, capacity included (a reservation's view page-rounded)."""
        sums = 0 if self.sums is None else 8 * (self.sums.numel() + self.sum_offs.numel())
        return reserve.held_bytes(self.pool) + sums

    def resident_bytes(self) -> int:
        sums = 0 if self.sums is None else 16 * self.n_blocks
        return self.used + sums

    # -- integrity -------------------------------------------------------------------------------
    def verify(self, entries: torch.Tensor) -> dict:
        """Check the blocks that table ``entries`` (int64, any shape) reference: offsets, structure (the
        reference decoder's validation), and the checksums when kept. ValueError names what is wrong."""
        g = self.geometry
        e = torch.unique(entries.reshape(-1).to(torch.int64))
        problems = []
        start = e & ~(ALIGN - 1)
        if bool(((e & (ALIGN - 1) & ~ENTRY_RAW) != 0).any()) or bool((start < 0).any()):
            problems.append("block-table entries that are not 16-byte offsets (+1 for BF16 blocks)")
        elif e.numel() and bool((start + self.block_lengths(e) > self.used).any()):
            problems.append(f"block-table entries past the pool ({self.used} bytes in use)")
        if not problems and e.numel():
            try:
                decode_pool_v3(self.pool[: self.used], e, self.base8[:1].expand(e.numel(), -1), self.base16[:1].expand(e.numel(), -1), g)
            except ValueError as err:
                problems.append(str(err))
        if not problems and self.sums is not None and e.numel():
            sums, sum_offs = self.sums.cpu(), self.sum_offs.cpu()
            at = torch.searchsorted(sum_offs, start.cpu())
            known = (at < sum_offs.numel()) & (sum_offs[at.clamp(max=max(sum_offs.numel() - 1, 0))] == start.cpu())
            lens = self.block_lengths(e)
            padded = torch.cat([self.pool, self.pool.new_zeros(g.raw_bytes)])
            rows = padded[start[:, None] + torch.arange(g.raw_bytes, device=self.device)]
            got = byte_sums(rows, 0, lens).cpu()
            bad = (~known) | (got != sums[at.clamp(max=max(sum_offs.numel() - 1, 0))])
            if bool(bad.any()):
                problems.append(f"checksum mismatch in blocks at offsets {start[bad.to(start.device)][:8].tolist()}")
        if problems:
            raise ValueError("corrupt GAAC cache: " + "; ".join(problems))
        raw = int((e & ENTRY_RAW).sum())
        return {"slot_rows": int(e.numel()) - raw, "raw_rows": raw, "checksums": self.sums is not None}


def store_kv_native(pools: list, tables: list, seqs: list, nb0: int, nfull: int) -> bool:
    """Encode and store the first ``nfull`` blocks of every row and head of K and V (``seqs``: BF16
    ``[B, H, S, D]``, any strides with channels contiguous) into the K and V pools and columns
    ``nb0 ..`` of ``tables`` (int64 ``[B, H, cap]``), with two calls into the CPU library: one encoder
    pass over every block of both kinds on the library's threads, read straight from the model's
    tensors, then one copy of the bytes into the pools. The pool bytes, tables and counters are those
    of ``encode`` + ``store`` (tests/test_cache_v3.py). Returns False, having done nothing, where this
    path does not apply (no library, checksums kept, non-contiguous tables): the caller takes that one."""
    pk, pv = pools
    if not (pk.native and pv.native) or pk.sums is not None or pv.sums is not None or pk.sync_free or pv.sync_free:
        return False
    if not all(t.is_contiguous() and t.dtype == torch.int64 for t in tables):
        return False
    bases = getattr(pk, "_kv_bases", None)
    if bases is None or bases[1] is not pv:
        bases = (torch.stack([torch.stack([p.base8, p.base16]) for p in pools]).contiguous(), pv)
        pk._kv_bases = bases  # uint8 [2 kinds, 2, H, D], built once per layer
    rows, nbytes, stats = native.encode_kv(seqs[0], seqs[1], nfull, bases[0], pk.geometry)
    st = stats.tolist()
    for p, (total, _, _, _) in zip(pools, st):
        p._room(total)
    native.pack_kv(rows, nbytes, stats, (pk.pool, pv.pool), (pk.used, pv.used), tables, nb0, nfull, pk.geometry)
    groups = rows.shape[1] * pk.geometry.groups
    for p, (total, wide, raw, bf16) in zip(pools, st):
        p.used += total
        p.n_blocks += rows.shape[1]
        p.encoded_blocks += rows.shape[1]
        p.counts[:4] += torch.tensor([groups - wide, wide - raw, raw, bf16])
    return True
