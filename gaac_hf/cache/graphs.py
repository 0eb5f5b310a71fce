"""Graph mode of a GAACCache: decode steps that read and write only through device tensors.

A captured CUDA graph replays the same kernels with the same arguments. Eager decode steps of a
GAACCache differ from one another in host integers (the tail length, the block count) that slices and
launch shapes bake in. While a :class:`DecodeGraphState` is attached to every GAAC layer, a decode step
(one token per row) goes through these device tensors instead, shared by the layers::

    pos      int64 [1]   tail position this step writes (the tail length before the step)
    col      int64 [1]   block-table column a closing step fills (the block count before the step)
    nbt      int32 [B]   blocks the attention kernel reads after this step's append
    tlt      int32 [B]   tail tokens the attention kernel reads after this step's append
    kv_start int32 [B]   or None: left padding (the graph runner passes no attention mask)

There are two kinds of step. ``append``: the token goes to the tail at ``pos`` (K and V in one CUDA launch where
it can, :mod:`gaac_hf.kernels.cuda.tail`; else two ``index_copy_``). ``close``: the token
completes the tail's block; the whole tail is encoded, stored at the pool's device counter
(:meth:`~gaac_hf.cache.pool_v3._BlockPoolV3.graph_store`) and its entries written at column ``col``.
:meth:`pre` and :meth:`post` advance the shared counts once per step (before and after the model's
forward); a runner (:mod:`gaac_hf.integrations.cuda_graphs`) captures one graph per kind, picks the kind
from the host counts (:meth:`kind`) and advances those after each step (:meth:`advance_host`): while a
step runs, the layers' host integers lag the device by one token (``get_seq_length()`` adds it once the
layer has appended, so mask sizes and the attention's length checks see what an eager step shows).
Left padding comes from ``kv_start``, never from a mask: on transformers 5.17 a decode step still gets
a (all-visible, capture-time sized) mask, whose count of masked positions would be 0.

No store grows anything inside a graph: :meth:`reserve` makes room, before any capture, for every block a
decode horizon of ``horizon`` steps can close at its worst case (BF16 size; B*Hkv blocks per close and
pool), and table columns for them. The attention grid is sized for that block count (``active_blocks``),
so one graph serves the whole horizon. The pools, tables and tails must stay where they were at
:meth:`reserve` (:meth:`valid` checks their addresses and the host counts; beam search, crop or a
prefill in between make the runner reserve and capture again).

Format v3 only, without checksums; on CUDA every GAAC layer must run the fused v3 kernel, on the CPU
(eager graph-mode steps, which tests compare against ordinary steps) the tiled attention of the CPU
library, and the pools must place blocks at device offsets (``sync_free``).
"""
from __future__ import annotations

import torch

from ..kernels.cpu import native
from ..kernels.paged import PagedKV
from .layer import _tail_kernel

_K, _V = 0, 1
APPEND, CLOSE = "append", "close"


class DecodeGraphState:
    """The device-side counts of a GAACCache's decode steps in graph mode (module docstring).

    Args:
        cache: a prefilled :class:`~gaac_hf.cache.GAACCache` whose layers are all GAAC layers.
        horizon: decode steps the reserved room covers (re-:meth:`reserve` for more).
        kv_start: int32 ``[B]`` left-padding positions per row, or None.
    """

    def __init__(self, cache, horizon: int, kv_start: torch.Tensor | None = None) -> None:
        from .layer import GAACLayer

        layers = list(cache.layers)
        if not layers or not all(isinstance(layer, GAACLayer) for layer in layers):
            raise ValueError("graph-mode decode steps need every cache layer to be a GAAC layer (this cache also "
                             "keeps stock layers: sliding-window, linear...); run eager decode steps")
        if not all(layer.is_initialized for layer in layers):
            raise ValueError("graph-mode decode steps start after the prefill: every cache layer must hold tokens")
        first = layers[0]
        for i, layer in enumerate(layers):
            layer._deferred.flush()
            why = None
            if layer.format_version not in (3, 4):
                why = f"format_version {layer.format_version} (graph mode is built on the v3 / v4 byte pools)"
            elif layer._wants_full_kv():
                why = ("the model's attention is not gaac_hf's (set attn_implementation='gaac' after gaac_hf.register(), "
                       "and leave return_full_kv unset)")
            elif layer.checksums:
                why = "checksums=True (their host-side records are not graph-capturable)"
            elif (layer.num_blocks, layer.tail_len) != (first.num_blocks, first.tail_len):
                why = "its token count differs from layer 0's"
            elif layer.device.type == "cuda" and not layer.fused_v3:
                why = "its decode steps would not run the fused kernel (see the warning GAACCache gave)"
            elif layer.device.type == "cpu" and layer.format_version == 4:
                why = "format v4 (graph-mode steps of v4 layers run on CUDA; the CPU's tiled attention is v3's)"
            elif layer.device.type == "cpu" and not native.available():
                why = "the CPU library is not built (graph mode on the CPU runs its tiled attention)"
            elif not all(p.sync_free for p in layer._pools):
                why = "its pools do not place blocks at device offsets (no v3 CUDA codec?)"
            if why is not None:
                raise ValueError(f"graph-mode decode steps: layer {i}: {why}")
        self.layers = layers
        self.block_size = first.geometry.block_size
        self.batch, self.heads = first.tails[_K].shape[:2]
        self.device = first.device
        self.kv_start = kv_start
        self.current = APPEND
        self.running = False  # True between pre() and post(): only then do layers take graph-mode steps
        self._heads = first._heads.view(1, self.heads).expand(self.batch, self.heads).reshape(-1)
        self.reserve(horizon)

    # -- host side -------------------------------------------------------------------------------
    def reserve(self, horizon: int) -> None:
        """Room and table columns for ``horizon`` more decode steps; resets the device counts from the
        host's and attaches the state to every layer. Outside any capture (it may grow tensors)."""
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1 decode step, got {horizon}")
        first = self.layers[0]
        nb, tl, t = first.num_blocks, first.tail_len, self.block_size
        closes = (tl + horizon) // t
        self.max_blocks = max(nb + closes, 1)
        for layer in self.layers:
            layer._deferred.flush()
            layer._ensure_table(self.max_blocks)
            layer._tail_room(t)  # T-token tails (always so on CUDA)
            for p in layer._pools:
                p.graph_reserve(closes * self.batch * self.heads)
            layer._graph = self
        dev, b = self.device, self.batch
        self.pos = torch.full((1,), tl, dtype=torch.int64, device=dev)
        self.col = torch.full((1,), nb, dtype=torch.int64, device=dev)
        self.nbt = torch.full((b,), nb, dtype=torch.int32, device=dev)
        self.tlt = torch.full((b,), tl, dtype=torch.int32, device=dev)
        self.steps_left = horizon
        self._expect = (nb, tl)
        self._addresses = self.addresses()

    def addresses(self) -> tuple[int, ...]:
        """Where every pool, table and tail of every layer lives now (what a captured graph baked in)."""
        return tuple(t.data_ptr() for layer in self.layers
                     for t in (*(p.pool for p in layer._pools), *layer._tables, *layer.tails))

    def valid(self) -> bool:
        """Whether the next step may run in graph mode: horizon left, the host counts those this state
        advanced to, and no pool, table or tail moved since :meth:`reserve`."""
        first = self.layers[0]
        return (self.steps_left > 0 and all(layer._graph is self for layer in self.layers)
                and (first.num_blocks, first.tail_len) == self._expect and self.addresses() == self._addresses)

    def kind(self) -> str:
        """The kind of the next decode step: ``close`` when its token completes the tail's block."""
        return CLOSE if self.layers[0].tail_len == self.block_size - 1 else APPEND

    def advance_host(self, kind: str) -> None:
        """After a step of ``kind`` ran (eager or replayed): the layers' host integers and the pools' host
        bookkeeping catch up with the device."""
        n = self.batch * self.heads
        for layer in self.layers:
            layer._graph_pending = 0
            if kind == CLOSE:
                layer.num_blocks += 1
                layer.tail_len = 0
                for p in layer._pools:
                    p.graph_stored(n)
            else:
                layer.tail_len += 1
        first = self.layers[0]
        self._expect = (first.num_blocks, first.tail_len)
        self.steps_left -= 1

    def detach(self) -> None:
        """Leave graph mode: layers take eager steps again; each pool snapshots its device counter so its
        host bound tightens (graph steps added their worst case to it)."""
        for layer in self.layers:
            if layer._graph is self:
                layer._graph = None
                for p in layer._pools:
                    p.bound.after_store(0, p.counts[3], p.n_blocks)

    # -- device side (inside a captured step) ------------------------------------------------------
    def pre(self, kind: str) -> None:
        """Before the forward of a step of ``kind``: the counts the attention kernel reads."""
        for layer in self.layers:
            layer._graph_pending = 0
        self.current, self.running = kind, True
        if kind == CLOSE:
            self.nbt.add_(1)
            self.tlt.zero_()
        else:
            self.tlt.add_(1)

    def post(self, kind: str) -> None:
        """After the forward: where the next step writes."""
        self.running = False
        if kind == CLOSE:
            self.pos.zero_()
            self.col.add_(1)
        else:
            self.pos.add_(1)

    def append(self, layer, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """A layer's append in graph mode: bf16 ``[B, H, 1, D]`` keys/values into the tail at ``pos``; in a
        ``close`` step the full tail encoded, stored and entered at column ``col``. The bytes and entries
        are those of an eager step (same encoder on the same 64 tokens, same device counter)."""
        if key_states.shape[2] != 1:
            raise RuntimeError(f"GAAC layer {layer.layer_idx} is in graph mode, which takes decode steps only "
                               f"(one token per row), got {key_states.shape[2]}: detach the graph state first")
        tails = layer.tails
        layer._graph_pending = 1  # get_seq_length() counts this step's token, as after an eager append
        if _tail_kernel(key_states, value_states, tails):
            from ..kernels.cuda.tail import tail_append

            tail_append(key_states, value_states, tails[_K], tails[_V], self.pos)  # both rows, one launch
        else:
            tails[_K].index_copy_(2, self.pos, key_states)
            tails[_V].index_copy_(2, self.pos, value_states)
        if self.current != CLOSE:
            return
        b, h, t, d = tails[_K].shape
        for kind in (_K, _V):
            blocks = tails[kind].view(b * h, t, d)
            pool = layer._pools[kind]
            entries = pool.graph_store(pool.encode(blocks, self._heads), blocks)
            layer._tables[kind].index_copy_(2, self.col, entries.view(b, h, 1))

    def paged_kv(self, layer, kv_start: torch.Tensor | None) -> PagedKV:
        """A layer as the attention kernels read it in graph mode: the device counts, a grid sized for the
        reserved blocks."""
        pk, pv = layer._pools
        return PagedKV(pk.paged(layer._tables[_K], layer.tails[_K]), pv.paged(layer._tables[_V], layer.tails[_V]),
                       self.nbt, self.tlt, layer.geometry, self.kv_start if self.kv_start is not None else kv_start,
                       active_blocks=self.max_blocks)
