"""The format v4 storage of one kind (K or V) of one layer: the v3 byte pool with fixed-size v4 blocks.

:class:`_BlockPoolV4` keeps the interface and the paging of :class:`~gaac_hf.cache.pool_v3._BlockPoolV3`
(one byte pool, int64 table entries ``offset | ENTRY_RAW``, growth in fixed pages, a host-sync-free store
at a device counter, CUDA-graph stores), so :class:`~gaac_hf.cache.layer.GAACLayer`'s bookkeeping (tail,
tables, crop, reorder, batch selection, graph-mode steps) is the same for both formats. What differs is
the codec (:mod:`gaac_hf.codec.v4`: register tiles with fixed 4-bit lanes, ``gaac_hf/format/v4.py``): a
block is stored either as its ``block_bytes`` of tiles or, when a tile cannot hold its raw groups, as its
BF16 bytes. Both lengths are known from ``fits`` alone, so every store is placed without reading
anything back, on the CPU as on CUDA. The lane layout differs between K and V: a pool knows its kind.

Codec: the PyTorch reference encoder (host-sync free, so it runs inside CUDA-graph captures) and packer;
decoding on CUDA with the attention kernel's own lane code (``decode_blocks_v4_cuda``) where it loads,
else the reference decoder.
"""
from __future__ import annotations

import torch

from ..codec.checksum import byte_sums
from ..codec.v4 import decode_pool_v4, encode_blocks_v4, pack_blocks_v4, stored_lengths
from ..format.v4 import ALIGN, ENTRY_RAW, HEAD_DIMS, KERNEL_HEAD_DIMS, GeometryV4
from ..kernels.paged import PagedTensorV4
from .pool_v3 import CPU_SYNC_FREE, GUARD, _BlockPoolV3, _EncodedV3, _UsedBound

KINDS = ("k", "v")


def geometry_v4(geometry) -> GeometryV4:
    """The v4 geometry of a (v2) calibration table's :class:`~gaac_hf.format.BlockGeometry`: same block size
    and head_dim; base16 is the window of both formats. Token-axis tables and head_dims v4 cannot lay out
    are refused with the reason."""
    if getattr(geometry, "group_axis", "channel") != "channel":
        raise ValueError("format_version=4 groups along channels only: this calibration table groups along tokens "
                         "(use format_version=2, or calibrate a channel-axis table)")
    if geometry.head_dim not in HEAD_DIMS:
        raise ValueError(f"format_version=4 takes head_dim in {HEAD_DIMS} (register tiles of 16 channels x 4 "
                         f"k-steps), this model has {geometry.head_dim}: use format_version=3")
    return GeometryV4(block_size=geometry.block_size, head_dim=geometry.head_dim)


def _cuda_decoder():
    """``decode_blocks_v4_cuda``, or None where the CUDA kernels cannot load."""
    try:
        from ..kernels.cuda import runtime
        from ..kernels.cuda.fused_attention_v4 import decode_blocks_v4_cuda
    except Exception:  # noqa: BLE001 - an optional backend must never break the cache
        return None
    return decode_blocks_v4_cuda if runtime.why_unavailable() is None else None


class _BlockPoolV4(_BlockPoolV3):
    """Encoded blocks of one kind of one layer in format v4 (see the module docstring).

    base8 (unused by v4, kept for the layer's statistics) and base16: uint8 ``[H, D]`` windows of this layer
    and kind; kind: "k" or "v".
    """

    def __init__(self, geometry: GeometryV4, base8: torch.Tensor, base16: torch.Tensor, device, kind: str,
                 step_blocks: int = 1, checksums: bool = False, sync_free: bool | None = None,
                 snapshot_lag: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.geometry = geometry
        self.kind = kind
        self.device = torch.device(device)
        self.base8, self.base16 = base8.to(self.device), base16.to(self.device).contiguous()
        self.native = False  # the CPU library is v3's
        self.cuda = None     # the v3 CUDA codec does not apply; decoding below
        self._decoder = _cuda_decoder() if self.device.type == "cuda" and geometry.head_dim in KERNEL_HEAD_DIMS else None
        self.pool = torch.zeros(GUARD, dtype=torch.uint8, device=self.device)
        # every store is placed without a host sync on CUDA (lengths follow from `fits`); on the CPU only
        # when asked (tests of graph-mode bookkeeping), where exact sizes are free anyway
        if sync_free is None:
            sync_free = self.device.type == "cuda" or CPU_SYNC_FREE
        self.bound = _UsedBound(self.device, snapshot_lag) if sync_free else None
        self._used = 0
        self.step_blocks = step_blocks
        # groups per mode (3-bit: always 0 in v4, 4-bit, raw), blocks stored as BF16, 0, 0 (the v2/v3 layout)
        self.counts = torch.zeros(6, dtype=torch.int64, device=self.device if sync_free else "cpu")
        self.encoded_blocks = 0
        self.n_blocks = 0
        sums_dev = self.device if sync_free else "cpu"
        self.sums = torch.zeros(0, dtype=torch.int64, device=sums_dev) if checksums else None
        self.sum_offs = torch.zeros(0, dtype=torch.int64, device=sums_dev) if checksums else None

    # -- encode and store ------------------------------------------------------------------------
    def encode(self, blocks: torch.Tensor, heads: torch.Tensor) -> _EncodedV3:
        """Encode bf16 ``[N, T, D]`` blocks (``heads`` int64 ``[N]``) with this pool's windows (no host sync)."""
        g = self.geometry
        enc = encode_blocks_v4(blocks, self.base16[heads], g, self.kind)
        n = blocks.shape[0]
        raw = enc.raw_groups.sum()
        modes = torch.stack([raw * 0, n * (g.numel // 8) - raw, raw])
        if self.bound is None:
            modes = modes.cpu()
        return _EncodedV3(enc.data, stored_lengths(enc.fits, g), enc.fits, modes)

    def _enc(self, enc: _EncodedV3):
        from ..codec.v4 import EncodedBlocksV4

        return EncodedBlocksV4(enc.rows, enc.fits, enc.modes.new_zeros(enc.fits.shape[0]))

    def store(self, enc: _EncodedV3, blocks: torch.Tensor, ub: int = 0, new=None) -> torch.Tensor:
        """Place encoded blocks at the end of the pool; returns their int64 table entries ``[N]``."""
        if self.bound is not None:
            return self._store_sync_free(enc, blocks, enc.nbytes.to(torch.int64))
        n = blocks.shape[0]
        lens = enc.nbytes.to(torch.int64)
        offs = self.used + torch.cumsum(lens, 0) - lens
        total = int(lens.sum())
        self._room(total)
        entries = pack_blocks_v4(self._enc(enc), blocks, self.pool, offs)
        if self.sums is not None:
            self.sums = torch.cat([self.sums, byte_sums(self._sources(enc, blocks), 0, lens).cpu()])
            self.sum_offs = torch.cat([self.sum_offs, offs.cpu()])
        self.used += total
        self.n_blocks += n
        self.encoded_blocks += n
        self.counts[:3] += enc.modes
        self.counts[3] += int((~enc.fits).sum())
        return entries

    def _sources(self, enc: _EncodedV3, blocks: torch.Tensor) -> torch.Tensor:
        """The bytes each block is stored as, uint8 ``[N, raw_bytes]`` (compressed rows zero-padded)."""
        n, rb = blocks.shape[0], self.geometry.raw_bytes
        comp = torch.cat([enc.rows, enc.rows.new_zeros(n, rb - enc.rows.shape[1])], 1)
        return torch.where(enc.fits[:, None], comp, blocks.reshape(n, -1).contiguous().view(torch.uint8).reshape(n, rb))

    def _store_sync_free(self, enc: _EncodedV3, blocks: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        n = blocks.shape[0]
        worst = n * g.raw_bytes
        if worst > self.page_bytes():  # a prefill: size it exactly (one sync), as the v3 pool does
            used, total, raw = torch.stack([self.bound.dev[0], lens.sum(), self.counts[3] + (~enc.fits).sum()]).tolist()
            self._room_exact(used, total)
            self.bound.set_exact(used + total, raw, self.n_blocks + n, worst)
        else:
            self._room_bound(worst)
        offs, entries = self._place(enc, blocks, lens)
        if self.sums is not None:
            self.sums = torch.cat([self.sums, byte_sums(self._sources(enc, blocks), 0, lens)])
            self.sum_offs = torch.cat([self.sum_offs, offs])
        self.n_blocks += n
        self.encoded_blocks += n
        self.bound.after_store(n * g.raw_bytes, self.counts[3], self.n_blocks)
        return entries

    def _place(self, enc: _EncodedV3, blocks: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Device work of a sync-free store (capturable in a CUDA graph): blocks packed at the device
        counter, the counter and the mode counts advanced. Returns (offsets, table entries) int64 ``[N]``."""
        ends = self.bound.dev + torch.cumsum(lens, 0)
        offs = ends - lens
        entries = pack_blocks_v4(self._enc(enc), blocks, self.pool, offs)
        if blocks.shape[0]:
            self.bound.dev.copy_(ends[-1:])
        self.counts[:3] += enc.modes
        self.counts[3] += (~enc.fits).sum()
        return offs, entries

    def graph_store(self, enc: _EncodedV3, blocks: torch.Tensor) -> torch.Tensor:
        return self._place(enc, blocks, enc.nbytes.to(torch.int64))[1]

    # -- reading ---------------------------------------------------------------------------------
    def decode_from(self, pool: torch.Tensor, used: int, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        e = entries.to(torch.int64).contiguous()
        if e.numel() == 0:
            return torch.empty(0, g.block_size, g.head_dim, dtype=torch.bfloat16, device=self.device)
        b16 = self.base16[heads].contiguous()
        if self._decoder is not None:
            return self._decoder(pool, e, b16, g, self.kind)
        try:
            return decode_pool_v4(pool, e, b16, g, self.kind, validate=self.device.type == "cpu")
        except ValueError as err:
            raise ValueError(f"corrupt GAAC cache: {err}") from None

    def block_lengths(self, entries: torch.Tensor) -> torch.Tensor:
        """int64 stored length of each block that table ``entries`` (int64 ``[N]``) point at."""
        g = self.geometry
        return torch.where((entries & ENTRY_RAW).bool(), g.raw_bytes, g.block_bytes)

    def paged(self, table: torch.Tensor, tail: torch.Tensor) -> PagedTensorV4:
        """This pool with a block table (int64) and tail buffer, as the attention kernels read it."""
        return PagedTensorV4(self.pool, table, tail, self.base16, self.kind)

    # -- integrity -------------------------------------------------------------------------------
    def verify(self, entries: torch.Tensor) -> dict:
        """Check the blocks that table ``entries`` (int64, any shape) reference: offsets, structure (the
        reference decoder's validation) and the checksums when kept. ValueError names what is wrong."""
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
                decode_pool_v4(self.pool.cpu(), e.cpu(), self.base16[:1].expand(e.numel(), -1).cpu(), g, self.kind,
                               validate=True)
            except ValueError as err:
                problems.append(str(err))
        if not problems and self.sums is not None and e.numel():
            sums, sum_offs = self.sums.cpu(), self.sum_offs.cpu()
            at = torch.searchsorted(sum_offs, start.cpu())
            last = max(sum_offs.numel() - 1, 0)
            known = (at < sum_offs.numel()) & (sum_offs[at.clamp(max=last)] == start.cpu())
            lens = self.block_lengths(e)
            padded = torch.cat([self.pool, self.pool.new_zeros(g.raw_bytes)])
            rows = padded[start[:, None] + torch.arange(g.raw_bytes, device=self.device)]
            got = byte_sums(rows, 0, lens).cpu()
            bad = (~known) | (got != sums[at.clamp(max=last)])
            if bool(bad.any()):
                problems.append(f"checksum mismatch in blocks at offsets {start[bad.to(start.device)][:8].tolist()}")
        if problems:
            raise ValueError("corrupt GAAC cache: " + "; ".join(problems))
        raw = int((e & ENTRY_RAW).sum())
        return {"slot_rows": int(e.numel()) - raw, "raw_rows": raw, "checksums": self.sums is not None}
