"""Compressed pages for a paged serving engine: GAAC storage under continuous batching.

A paged engine (transformers' continuous batching) hands out *blocks*: ``page_size`` tokens of every
layer of a group of full-attention layers, one *page* per layer. :class:`PageStore` gives each block
two kinds of storage:

* a **slot area** of ``L * slot_bytes`` (``slot_bytes`` per page: K and V of one layer), cut from a
  byte tensor the engine owns and sizes: the pages' format v3 blocks (``T`` tokens x one kv head each,
  ``docs/FORMAT_V3.md``) back to back at 16-byte aligned offsets, layer after layer, K's then V's, each
  compressed or, when it does not compress, as its BF16 bytes (entry ``| 1``). The layers share the
  area (a page larger than ``slot_bytes`` borrows from smaller ones), and ``GUARD`` bytes stay free at
  its end, so a decoder's read-ahead never leaves it;
* a BF16 **frame** (all layers of the block) while the block is *open* (being written token by token,
  the "tail" of the paper). When the engine's write fills the block, each layer's page is encoded into
  its slot (:meth:`close`, called per layer inside the forward); after the last layer
  (:meth:`finish_close`) the frame is given back, unless a page did not fit its slot (an *overflow*):
  then the whole block stays BF16 in its frame until it is freed, and nothing is lost.

Frames 0 and 1 are never given out: an engine's padding tokens read from frame 0 and write to frame 1
(transformers' "trash" rows). Every byte is accounted for by :meth:`stats`.

Shapes: L layers in the group, H kv heads, D head_dim, P = page_size, T = the v3 block size (P % T == 0),
J = P / T v3 blocks per head and page. Frames: BF16 ``[F, L, 2, P, H, D]`` (token-major pages, the
5.23+ engines' layout) or the engine's per-layer tensors (5.17), see :meth:`PageStore.bind`; ``entries``: int64 ``[num_blocks, L, 2, H * J]`` byte offsets into the slot tensor.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..calibration.table import CalibrationTable
from ..format.v3 import ENTRY_RAW
from ..kernels.cpu import native
from ..kernels.paged import PagedKV, PagedTensorV3
from .pool_v3 import GUARD, _BlockPoolV3, geometry_v3

#: frames never given out (an engine's padding tokens read one and write the other)
TRASH_FRAMES = 2
#: warn once when more than this share of the first OVERFLOW_CHECK_BLOCKS closed blocks overflowed
OVERFLOW_WARN_SHARE, OVERFLOW_CHECK_BLOCKS = 0.05, 32


@dataclass(frozen=True)
class DecodePlan:
    """What a decode step of a batch reads, for :meth:`PageStore.paged_kv` (built once per batch).

    ids: int64 ``[B, max(1, nb)]`` the compressed blocks of each request but its last, in order (padding
    repeats a valid block and is never read); frames: int64 ``[B]`` the frame of each request's last
    (open or just filled) block, the kernel's tail; num_blocks / tail_len: int32 ``[B]``."""

    ids: torch.Tensor
    frames: torch.Tensor
    num_blocks: torch.Tensor
    tail_len: torch.Tensor
    max_blocks: int


@dataclass(frozen=True)
class PageLayout:
    """Sizes of one block of a :class:`PageStore` (see the module docstring for the symbols)."""

    layers: int
    kv_heads: int
    head_dim: int
    page_size: int
    block_size: int
    slot_bytes: int

    @property
    def bf16_page_bytes(self) -> int:
        """K + V of one layer's page in BF16."""
        return 2 * self.page_size * self.kv_heads * self.head_dim * 2

    @property
    def blocks_per_page(self) -> int:
        """v3 blocks of one kind (K or V) in a page: H * J."""
        return self.kv_heads * (self.page_size // self.block_size)

    @property
    def frame_bytes(self) -> int:
        return self.layers * self.bf16_page_bytes


def slot_bytes_for(kv_heads: int, head_dim: int, page_size: int, slot_fraction: float) -> int:
    """Slot size of one page (K + V of one layer) at ``slot_fraction`` of its BF16 bytes, rounded up to
    128 bytes (a block's slot area keeps ``GUARD`` of its bytes free). At the v3 ratio of ~1.41 a page
    takes ~0.71 of its BF16 bytes; a block whose pages do not fit stays BF16 (an overflow), so a
    fraction a little above the ratio's inverse trades a few overflows for memory."""
    if not 0.1 <= slot_fraction <= 1.0:
        raise ValueError(f"slot_fraction must be in [0.1, 1.0], got {slot_fraction}")
    raw = 2 * page_size * kv_heads * head_dim * 2
    return -(-math.ceil(raw * slot_fraction) // 128) * 128


class PageStore:
    """GAAC storage of the blocks of one group of full-attention layers (see the module docstring).

    Args:
        table: the model's calibration table (its windows, per layer and kv head).
        layer_indices: the model layers of the group, in the engine's page order.
        page_size: tokens per page (a multiple of the table's v3 block size).
        device: where frames, slots and entries live.
        slot_bytes: bytes of one page's slot (:func:`slot_bytes_for`).
    """

    def __init__(self, table: CalibrationTable, layer_indices: list[int], page_size: int, device,
                 slot_bytes: int) -> None:
        g = self.geometry = geometry_v3(table.geometry)
        if page_size % g.block_size:
            raise ValueError(f"page_size {page_size} must be a multiple of the GAAC block size {g.block_size}")
        self.device = torch.device(device)
        self.layer_indices = list(layer_indices)
        h = table.num_kv_heads
        self.layout = PageLayout(len(self.layer_indices), h, g.head_dim, page_size, g.block_size, slot_bytes)
        if slot_bytes % 16 or slot_bytes * len(self.layer_indices) <= GUARD:
            raise ValueError(f"slot_bytes {slot_bytes} must be a multiple of 16 and leave room past the {GUARD}-byte guard")
        # one codec (windows + encoder / decoder dispatch) per layer and kind; their own pools stay empty
        self._codecs = [[_BlockPoolV3(g, *table.bases(layer, kind), self.device) for kind in (0, 1)]
                        for layer in self.layer_indices]
        j = page_size // g.block_size
        # v3 block i of a page's kind: head i // J, tokens (i % J) * T ...
        self._heads = torch.arange(h, device=self.device).repeat_interleave(j)
        self.slots = None
        self.frames = None
        self.entries = None
        self._frame_of: dict[int, int] = {}
        self._free_frames: list[int] = []
        self._overflow: set[int] = set()
        self._fill: dict[int, int] = {}  # bytes of a closing block's slot area taken by its closed layers
        self.counters = dict(closed_blocks=0, overflow_blocks=0, bf16_v3_blocks=0, encoded_v3_blocks=0)
        self._warned = False

    # -- binding to the engine's memory -------------------------------------------------------------
    def bind(self, slots: torch.Tensor, num_blocks: int, num_frames: int, layer_frames: list | None = None) -> None:
        """Use ``slots`` (uint8, at least ``num_blocks * L * slot_bytes`` bytes; block b's slot area at
        byte ``b * L * slot_bytes``) and ``num_frames`` frames, two of them trash.

        layer_frames: None allocates the frames as one BF16 ``[F, L, 2, P, H, D]`` tensor, trash frames
        0 and 1 (the 5.23+ engines' block layout: a frame is contiguous, rows ``f * 2LP + p`` of a
        shifted per-layer view). Or the engine's own per-layer tensors ``[(K, V) per layer]``, each BF16
        ``[num_frames * P, H, D]``, trash the last two frames (5.17's layout: rows ``f * P + p``)."""
        lay = self.layout
        if slots.dtype != torch.uint8 or slots.dim() != 1 or slots.numel() < num_blocks * lay.layers * lay.slot_bytes:
            raise ValueError(f"slots must be uint8 [>= {num_blocks * lay.layers * lay.slot_bytes}], got "
                             f"{slots.dtype} {tuple(slots.shape)}")
        if num_frames <= TRASH_FRAMES:
            raise ValueError(f"num_frames must be more than the {TRASH_FRAMES} trash frames, got {num_frames}")
        self.slots = slots
        self.num_blocks = num_blocks
        shape = (lay.page_size, lay.kv_heads, lay.head_dim)
        if layer_frames is None:
            self.frames = torch.zeros(num_frames, lay.layers, 2, *shape, dtype=torch.bfloat16, device=self.device)
            self._pages = [[self.frames[:, pos, kind] for kind in (0, 1)] for pos in range(lay.layers)]
            flat = self.frames.view(-1, lay.kv_heads, lay.head_dim)
            self._views = [[flat[(2 * pos + kind) * lay.page_size:] for kind in (0, 1)] for pos in range(lay.layers)]
            self.frame_stride = 2 * lay.layers * lay.page_size
            usable = range(TRASH_FRAMES, num_frames)
        else:
            if len(layer_frames) != lay.layers or any(t.shape != (num_frames * lay.page_size, lay.kv_heads, lay.head_dim)
                                                      or t.dtype != torch.bfloat16 for kv in layer_frames for t in kv):
                raise ValueError(f"layer_frames must be {lay.layers} (K, V) pairs of BF16 [{num_frames * lay.page_size}, "
                                 f"{lay.kv_heads}, {lay.head_dim}]")
            self.frames = None
            self._pages = [[t.view(num_frames, *shape) for t in kv] for kv in layer_frames]
            self._views = [list(kv) for kv in layer_frames]
            self.frame_stride = lay.page_size
            usable = range(0, num_frames - TRASH_FRAMES)
        self._frame_bytes = sum(t.numel() * 2 for kv in self._views for t in kv) if layer_frames else self.frames.numel() * 2
        self.entries = torch.zeros(num_blocks, lay.layers, 2, lay.blocks_per_page, dtype=torch.int64, device=self.device)
        self._free_frames = list(reversed(usable))  # pop() gives the lowest first
        self._frame_of.clear()
        self._overflow.clear()
        self._fill.clear()

    def frame_view(self, layer_pos: int, kind: int) -> torch.Tensor:
        """BF16 ``[rows, H, D]`` view of the frames in which token p of frame f of this layer and kind
        is row ``f * frame_stride + p`` (the engine's addressing)."""
        return self._views[layer_pos][kind]

    def frame_page(self, frame: int, layer_pos: int, kind: int) -> torch.Tensor:
        """BF16 ``[P, H, D]``: one page of a frame."""
        return self._pages[layer_pos][kind][frame]

    # -- frames ---------------------------------------------------------------------------------------
    @property
    def free_frames(self) -> int:
        return len(self._free_frames)

    def frame_of(self, block: int) -> int | None:
        """The frame holding ``block`` in BF16 (open, closing, or overflowed), or None if compressed."""
        return self._frame_of.get(block)

    def open_block(self, block: int) -> int:
        """Give a fresh block a frame (it is written in BF16 until it is full); returns the frame."""
        if block in self._frame_of:
            raise RuntimeError(f"GAAC page store: block {block} is already open")
        if not self._free_frames:
            raise RuntimeError("GAAC page store: no free BF16 frame (the engine admitted more open blocks than "
                               "frames: a bug in the admission check)")
        f = self._frame_of[block] = self._free_frames.pop()
        return f

    def free(self, block: int) -> None:
        """The engine freed ``block``: its frame (if any) returns; its slot is the engine's to reuse."""
        f = self._frame_of.pop(block, None)
        if f is not None:
            self._free_frames.append(f)
        self._overflow.discard(block)
        self._fill.pop(block, None)

    # -- closing full blocks --------------------------------------------------------------------------
    def close(self, layer_pos: int, blocks: list[int]) -> None:
        """Encode the page of layer position ``layer_pos`` of each full ``block`` (in its frame) into the
        block's slot area, after the pages of the layers closed before it. A page that does not fit
        the room left makes the block an overflow: it stays BF16 in its frame (its later layers are not
        encoded). Host-syncs once (the page sizes decide what fits)."""
        blocks = [b for b in blocks if b not in self._overflow]
        if not blocks:
            return
        lay, g = self.layout, self.geometry
        frames = torch.tensor([self._frame_of[b] for b in blocks], device=self.device)
        n, m = len(blocks), lay.blocks_per_page
        xs, encs = [], []
        for kind in (0, 1):
            page = self._pages[layer_pos][kind][frames]  # [n, P, H, D]
            x = page.permute(0, 2, 1, 3).reshape(n * m, g.block_size, g.head_dim).contiguous()
            xs.append(x)
            encs.append(self._codecs[layer_pos][kind].encode(x, self._heads.repeat(n)))
        lens = torch.stack([torch.where(e.fits, e.nbytes.to(torch.int64), g.raw_bytes).view(n, m) for e in encs], 1)
        starts = (lens.view(n, 2 * m).cumsum(1) - lens.view(n, 2 * m)).view(n, 2, m)
        totals = lens.sum((1, 2)).tolist()  # the host sync of a close
        room = lay.layers * lay.slot_bytes - GUARD
        keep, base = [], []
        for i, b in enumerate(blocks):
            if layer_pos == 0:
                self._fill[b] = 0
            if self._fill[b] + totals[i] > room:
                self._overflow.add(b)
                continue
            keep.append(i)
            base.append(b * lay.layers * lay.slot_bytes + self._fill[b])
            self._fill[b] += totals[i]
        if not keep:
            return
        sel = torch.tensor(keep, device=self.device)
        ids = torch.tensor([blocks[i] for i in keep], dtype=torch.int64, device=self.device)
        offs = torch.tensor(base, dtype=torch.int64, device=self.device)[:, None, None] + starts[sel]
        for kind, (x, e) in enumerate(zip(xs, encs)):
            o = offs[:, kind].reshape(-1)
            fits = e.fits.view(n, m)[sel].reshape(-1)
            _pack(e.rows.view(n, m, -1)[sel].reshape(len(keep) * m, -1), e.nbytes.view(n, m)[sel].reshape(-1),
                  x.view(n, m, g.block_size, g.head_dim)[sel].reshape(-1, g.block_size, g.head_dim), o, self.slots, g)
            self.entries[ids, layer_pos, kind] = (o + torch.where(fits, 0, ENTRY_RAW)).view(len(keep), m)
            self.counters["bf16_v3_blocks"] += int((~fits).sum())
            self.counters["encoded_v3_blocks"] += fits.numel()

    def finish_close(self, blocks: list[int]) -> list[int]:
        """After every layer's :meth:`close` of ``blocks``: the frames of blocks whose every page fit
        return to the free list (returned); overflowed blocks keep theirs."""
        released = []
        c = self.counters
        if not self._warned and c["closed_blocks"] + len(blocks) >= OVERFLOW_CHECK_BLOCKS > c["closed_blocks"]:
            over = c["overflow_blocks"] + sum(b in self._overflow for b in blocks)
            if over > OVERFLOW_WARN_SHARE * (c["closed_blocks"] + len(blocks)):
                self._warned = True
                warnings.warn(f"GAAC serving: {over} of the first {c['closed_blocks'] + len(blocks)} full blocks did not fit "
                              "their slots and stay BF16 (they hold frames, so fewer requests fit): the calibration table "
                              "does not fit this model's K/V (calibrate one: gaac-calibrate), or raise slot_fraction",
                              RuntimeWarning, stacklevel=2)
        for b in blocks:
            self.counters["closed_blocks"] += 1
            self._fill.pop(b, None)
            if b in self._overflow:
                self.counters["overflow_blocks"] += 1
                continue
            f = self._frame_of.pop(b)
            self._free_frames.append(f)
            released.append(f)
        return released

    # -- reading --------------------------------------------------------------------------------------
    def read(self, layer_pos: int, blocks) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode the pages of layer position ``layer_pos`` of compressed ``blocks`` (a list, or the
        int64 tensor of :meth:`block_ids`, which a caller reading every layer builds once): K, V BF16
        ``[n, P, H, D]`` (bit-exact: the format's contract)."""
        lay = self.layout
        ids = blocks if isinstance(blocks, torch.Tensor) else self.block_ids(blocks)
        n = ids.numel()
        heads = self._heads.repeat(n)
        out = []
        for kind in (0, 1):
            ent = self.entries[ids, layer_pos, kind].reshape(-1)
            x = self._codecs[layer_pos][kind].decode_from(self.slots, self.slots.numel(), ent, heads)
            out.append(x.view(n, lay.kv_heads, lay.page_size, lay.head_dim).permute(0, 2, 1, 3))
        return out[0], out[1]

    def paged_kv(self, layer_pos: int, plan: DecodePlan) -> PagedKV:
        """Layer position ``layer_pos`` of a decode step as the fused v3 kernel reads it: the slot tensor
        as the pool (every compressed page is one v3 block per head at its entry's offset, ``GUARD`` bytes
        free at the end), block tables gathered from the entry table, each request's last page copied
        from its frame as the tail. Needs ``page_size == block_size`` (one v3 block per head and page).

        Returns a :class:`~gaac_hf.kernels.paged.PagedKV` of :class:`PagedTensorV3` (tables int64
        ``[B, H, max_blocks]``, tails BF16 ``[B, H, T, D]``)."""
        lay, g = self.layout, self.geometry
        if lay.page_size != g.block_size:
            raise ValueError(f"paged_kv needs page_size == the v3 block size ({g.block_size}), got {lay.page_size}")
        kinds = []
        for kind in (0, 1):
            table = self.entries[plan.ids, layer_pos, kind].permute(0, 2, 1).contiguous()  # [B, H, nb]
            tail = self._pages[layer_pos][kind].index_select(0, plan.frames).permute(0, 2, 1, 3).contiguous()
            codec = self._codecs[layer_pos][kind]
            kinds.append(PagedTensorV3(self.slots, table, tail, codec.b8p, codec.dbp))
        return PagedKV(kinds[0], kinds[1], plan.num_blocks, plan.tail_len, g, active_blocks=max(1, plan.max_blocks))

    def bases(self, layer_pos: int, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 ``[H, D]`` base8 / base16 windows of a layer position and kind."""
        codec = self._codecs[layer_pos][kind]
        return codec.base8, codec.base16

    def decode_entries(self, layer_pos: int, kind: int, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """BF16 ``[n, T, D]``: the v3 blocks at slot-tensor ``entries`` (int64 ``[n]``) of kv ``heads``
        (int ``[n]``), decoded with this layer position and kind's windows."""
        return self._codecs[layer_pos][kind].decode_from(self.slots, self.slots.numel(), entries, heads)

    def block_ids(self, blocks: list[int]) -> torch.Tensor:
        """int64 ``[n]`` on the store's device (one host-to-device copy)."""
        return torch.tensor(blocks, dtype=torch.int64, device=self.device)

    # -- accounting -----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Bytes held: ``slot_bytes`` (the slot tensor the engine gave), ``frame_bytes`` (all frames),
        ``entry_bytes`` (the entry table), and the counters (closed / overflowed blocks, v3 blocks
        stored compressed or as BF16)."""
        lay = self.layout
        return dict(self.counters, slot_bytes=self.slots.numel() if self.slots is not None else 0,
                    frame_bytes=self._frame_bytes if self.slots is not None else 0,
                    entry_bytes=self.entries.numel() * 8 if self.entries is not None else 0,
                    bytes_per_block=lay.layers * lay.slot_bytes, bf16_bytes_per_block=lay.frame_bytes,
                    open_frames=len(self._frame_of), free_frames=len(self._free_frames))


def _pack(rows: torch.Tensor, nbytes: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, pool: torch.Tensor, g) -> None:
    """Write encoded v3 blocks (or, where ``nbytes > raw_bytes``, their BF16 bytes from ``x``) into
    ``pool`` at ``offs``: the CPU library's pack, else the same in torch."""
    if pool.device.type == "cpu" and native.available():
        native.pack_v3(rows, nbytes, x, offs, pool, g)
        return
    fits = nbytes <= g.raw_bytes
    lens = torch.where(fits, nbytes.to(torch.int64), g.raw_bytes)
    src = torch.where(fits[:, None], rows, x.reshape(x.shape[0], -1).view(torch.uint8))
    owner = torch.repeat_interleave(torch.arange(rows.shape[0], device=rows.device), lens)
    start = torch.cumsum(lens, 0) - lens
    at = torch.arange(owner.numel(), device=rows.device) - start[owner]
    pool[offs[owner] + at] = src[owner, at]
