"""GAACLayer: one full-attention layer's K and V as GAAC blocks plus an uncompressed tail.

Storage per kind (K/V): a :class:`~gaac_hf.cache.pool._BlockPool` (format v2; block table int32) or a
:class:`~gaac_hf.cache.pool_v3._BlockPoolV3` (format v3; block table int64 byte offsets) or its format v4
twin :class:`~gaac_hf.cache.pool_v4._BlockPoolV4` (fixed-size register-tile blocks), a block table
``[B, H, cap_blocks]`` and a tail bf16 ``[B, H, T, D]``; see :mod:`gaac_hf.cache` for the whole picture.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from ..calibration.table import CalibrationTable
from ..format import BlockGeometry
from ..kernels.paged import PagedKV
from .attention import uses_gaac_attention
from .compat import POSITIVE_CROP_IS_LENGTH
from .host import _HOST_SLOTS_PER_LAYER, _CountsMemo, _DeferredStore, _DeviceTables, _FitnessCheck, _HostSlab
from .pool import _BlockPool, _grow, _reserve_from, _round_up, _sync_plan, decode_tables
from .fused_v3 import report_fallback_once, why_unavailable
from .pool_v3 import _BlockPoolV3, default_format, geometry_v3, store_kv_native
from .pool_v4 import KINDS, _BlockPoolV4, geometry_v4

_K, _V = 0, 1

#: block-table columns added per growth (int32 entries: 4 bytes per row and head per column)
TABLE_PAGE = 64


def _tail_kernel(key_states: torch.Tensor, value_states: torch.Tensor, tails) -> bool:
    """Whether a decode step's append (eager or graph mode) writes K and V with the one-launch CUDA kernel
    (``gaac_hf.kernels.cuda.tail``: one kernel per layer instead of two copies, ~1.8 us of kernel each and, in
    a replayed graph, ~2 us of gap each; call Y29's kernel tables); elsewhere (CPU, no CUDA kernels,
    unaligned rows) two copies. Both write the same bits."""
    if key_states.device.type != "cuda":
        return False
    try:
        from ..kernels.cuda import tail
    except ImportError:  # pragma: no cover - the package always ships it
        return False
    return tail.takes(key_states, value_states, tails[_K], tails[_V])


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


def _query_group(config) -> int | None:
    """Query heads per kv head of a (text) config, or None when it does not say."""
    hq, hkv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    return hq // hkv if isinstance(hq, int) and isinstance(hkv, int) and hkv else None


class _BlockedLayer(CacheLayerMixin):
    """The transformers layer API of a layer that holds ``num_blocks`` encoded blocks of
    ``geometry.block_size`` tokens plus a ``tail_len``-token tail (BF16 :class:`GAACLayer`, FP8
    :class:`~gaac_hf.cache.fp8.GAACFP8Layer`); ``reset`` calls the subclass's ``_reset_state``.

    Deliberately no ``_layer_type``: setting it would register the class in transformers'
    ``DYNAMIC_LAYER_TYPE_MAPPING`` and take over every ``DynamicCache(config=...)``.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = True

    _graph_pending = 0  # graph mode: this step's token, appended on the device, not yet in the host counts

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.num_blocks * self.geometry.block_size + self.tail_len + self._graph_pending

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


class GAACLayer(_BlockedLayer):
    """Cache layer of one full-attention layer holding GAAC-compressed K and V (no ``_layer_type``: see
    :class:`_BlockedLayer`)."""

    def __init__(self, layer_idx: int, table: CalibrationTable, geometry: BlockGeometry, config,
                 return_full_kv: bool | None = None, fused: bool | str | None = None, triton_codec: bool = True,
                 counts_memo: _CountsMemo | None = None, deferred: _DeferredStore | None = None,
                 host_slab: _HostSlab | None = None, device_tables: _DeviceTables | None = None,
                 fitness: _FitnessCheck | None = None, checksums: bool = False,
                 format_version: int | None = None) -> None:
        super().__init__()
        self._fitness = fitness if fitness is not None else _FitnessCheck(table)  # see there
        self._fitness.layers.append(self)
        self._device_tables = device_tables if device_tables is not None else _DeviceTables()  # see there
        self._counts_memo = counts_memo if counts_memo is not None else _CountsMemo()  # see paged_kv()
        self._deferred = deferred if deferred is not None else _DeferredStore()  # see _DeferredStore
        self._host_slab = host_slab if host_slab is not None else _HostSlab(_HOST_SLOTS_PER_LAYER)
        self.layer_idx = layer_idx
        self.geometry = geometry
        self._table = table
        self._config = config  # live model config: read at each update() to pick the return mode
        self._return_full_kv = return_full_kv
        # decode steps through a kernel over the compressed blocks (CUDA: the fused kernel of the layer's
        # format; CPU, format v3: the tiled C++ attention); None = the device's default, set at the first
        # update: True on CUDA, False on the CPU (decode + SDPA: bit-identical to DynamicCache + sdpa)
        self.fused = fused
        self.triton_codec = triton_codec  # Triton encoder/decoder for CUDA pools (same bytes/bits)
        self.checksums = checksums  # per-block checksums written at encode time (see verify())
        # storage format: 2, 3 or 4, or None = chosen at the first update (pool_v3.default_format)
        self._format_request = format_version
        self.format_version = format_version or 2
        self._geometry_v2 = geometry
        self._awaiting_attention = False
        self._reset_state()

    def _reset_state(self) -> None:
        # graph mode (gaac_hf.cache.graphs.DecodeGraphState): decode steps through device-side counts
        # while its runner runs one; a reset detaches it (the runner sees that and reserves anew)
        self._graph = None
        self._deferred.drop(self)  # a parked append of this layer is void
        self.is_initialized = False
        self._pools: list[_BlockPool] | None = None
        self._tables: list[torch.Tensor] | None = None  # K and V, int32 (v2) / int64 (v3) [B, H, cap_blocks]
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
        """K and V block tables, int32 (v2) or int64 (v3) ``[B, H, cap_blocks]`` (None before the first update)."""
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
        dev = key_states.device
        group = _query_group(self._config)
        self.format_version = self._format_request or default_format(
            dev, d, group, getattr(self._geometry_v2, "group_axis", "channel"))
        if self.fused is None:
            self.fused = dev.type == "cuda"
        g = self.geometry = {2: lambda g: g, 3: geometry_v3, 4: geometry_v4}[self.format_version](self._geometry_v2)
        if d != g.head_dim:
            raise ValueError(
                f"layer {self.layer_idx}: KV head_dim {d} does not match the calibration table's {g.head_dim}"
            )
        self.device = dev
        table = self._device_tables.get(_local_heads(self._table, h, self.layer_idx), dev)
        cuda = dev.type == "cuda"
        # decode steps through the fused CUDA kernel of this layer's format, v3 or v4 (see fused_v3.takes)
        self.fused_v3 = False
        if self.format_version in (3, 4) and cuda:
            reason = why_unavailable(dev, d, group, self.format_version)
            self.fused_v3 = reason is None
            if reason is not None and self.fused:
                report_fallback_once(self, reason)
        if self.format_version == 4:
            self._pools = [_BlockPoolV4(g, *table.bases(self.layer_idx, kind), dev, KINDS[kind], b * h, self.checksums)
                           for kind in (_K, _V)]
        elif self.format_version == 3:
            b8p, dbp = self._device_tables.pair_constants(table)
            self._pools = [_BlockPoolV3(g, *table.bases(self.layer_idx, kind), dev, b * h, self.checksums,
                                        (b8p[self.layer_idx, kind], dbp[self.layer_idx, kind])) for kind in (_K, _V)]
        else:
            self._pools = [_BlockPool(g, *table.bases(self.layer_idx, kind), dev, self.triton_codec, b * h,
                                      self._host_slab.take(2) if cuda else None, self.checksums)
                           for kind in (_K, _V)]
        # One column from the start: kernels take the full-capacity table and want max_blocks >= 1.
        # Entries: int32 (v2 slot rows) or int64 (v3 byte offsets).
        edt = self._pools[_K].entry_dtype
        self._tables = [torch.zeros(b, h, 1, dtype=edt, device=dev) for _ in (_K, _V)]
        # CUDA: the whole T-token tail, which the fused kernel reads; CPU: grown in quarter blocks
        self._tail_page = g.block_size if cuda else max(g.block_size // 4, 1)
        cap = g.block_size if cuda else 0
        self.tails = [torch.zeros(b, h, cap, d, dtype=torch.bfloat16, device=dev) for _ in (_K, _V)]
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
                "for attention functions other than gaac_hf.cache.attention.gaac_attention_forward."
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
        if self._graph is not None and self._graph.running:
            return self._graph.append(self, key_states, value_states)
        b, h, q, _ = key_states.shape
        tails = self.tails
        if b != tails[_K].shape[0]:
            raise ValueError(f"GAAC layer {self.layer_idx}: batch of {b} rows but the cache holds {tails[_K].shape[0]}")
        t, tl, nb0 = self.geometry.block_size, self.tail_len, self.num_blocks
        if tl + q < t:
            # no block completes (every decode step but one in T): the tail holds all of it
            self._tail_room(tl + q)
            tails = self.tails
            if q == 1 and _tail_kernel(key_states, value_states, tails):
                from ..kernels.cuda.tail import tail_append

                tail_append(key_states, value_states, tails[_K], tails[_V], self._counts_memo.position(tl, key_states.device))
            else:
                tails[_K][:, :, tl : tl + q].copy_(key_states)
                tails[_V][:, :, tl : tl + q].copy_(value_states)
            self.tail_len = tl + q
            return None
        # an empty tail (a prefill, the step after a block completed) needs no concatenation: the
        # blocks are read from the model's tensors as they are
        seqs = [torch.cat([tails[kind][:, :, :tl], new], dim=2) if tl else new
                for kind, new in ((_K, key_states), (_V, value_states))]
        nfull = (tl + q) // t
        rem = tl + q - nfull * t
        self._deferred.flush()  # the pools' counters and every table must be current before this append
        self._ensure_table(self.num_blocks + nfull)
        if self.format_version == 3 and store_kv_native(self._pools, self._tables, seqs, nb0, nfull):
            self._fitness.observe()
            return self._finish_append(seqs, nfull, rem)
        seqs = [x.contiguous() for x in seqs]
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
        return self._finish_append(seqs, nfull, rem)

    def _finish_append(self, seqs: list, nfull: int, rem: int) -> tuple[int, list[torch.Tensor]]:
        # the last rem positions become the tail; returns what append() does
        nb0, t = self.num_blocks, self.geometry.block_size
        self._tail_room(rem, shrink=True)
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
        self._fitness.observe()

    def _wants_full_kv(self) -> bool:
        if self._return_full_kv is not None:
            return self._return_full_kv
        return not uses_gaac_attention(self._config)

    def _ensure_table(self, blocks: int) -> None:
        # fixed pages of TABLE_PAGE columns; the kernel's split grid follows the live block count
        # (paged_kv's active_blocks), not the capacity
        self._tables = [_grow(tb, blocks, dim=2, page=TABLE_PAGE) for tb in self._tables]

    def _tail_room(self, tokens: int, shrink: bool = False) -> None:
        """Make the tail buffers hold at least ``tokens`` positions (their first ``tail_len`` kept).
        CPU tails grow in pages of ``T / 4`` tokens; ``shrink`` (a block just completed, the tail
        is about to be rewritten) also gives back the pages past ``tokens``. CUDA tails are T tokens
        from the start and never change."""
        cap = self.tails[_K].shape[2]
        if cap == self.geometry.block_size and self.device.type == "cuda":
            return
        want = _round_up(tokens, self._tail_page)
        if want == cap or (want < cap and not shrink):
            return
        if want < cap:
            self.tails = [tl[:, :, :want].clone() for tl in self.tails]  # nothing past `tokens` is kept
        else:
            self.tails = [_grow(tl, tokens, dim=2, page=self._tail_page) for tl in self.tails]

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
            if not POSITIVE_CROP_IS_LENGTH:
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
            self._tail_room(rem)
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
            decode_tables([p.paged(self._tables[kind].contiguous(), self.tails[kind]) for p, kind in zip(pools, kinds)],
                          self.geometry, nb, out, tails)
            return list(out.unbind(0))
        res = []
        heads = self._heads.view(1, h, 1).expand(b, h, nb).reshape(-1)
        for p, kind, tail in zip(pools, kinds, tails):
            blocks = p.gather(self._tables[kind][:, :, :nb].reshape(-1), heads)
            res.append(torch.cat([blocks.view(b, h, nb * t, d), tail], dim=2))
        return res

    def paged_kv(self, kv_start: torch.Tensor | None = None) -> PagedKV:
        """This layer as the attention kernels read it (:class:`~gaac_hf.kernels.paged.PagedKV`).

        Pools, full-capacity contiguous tables int32 (v2; int64 for v3) ``[B, H, cap_blocks]`` (entries past
        ``num_blocks`` are ignored by the kernel), full tail buffers bf16 ``[B, H, T, D]``, bases
        uint8 ``[H, D]`` and ``num_blocks`` / ``tail_len`` as int32 ``[B]`` device tensors (read-only:
        shared with the other layers of the cache that have the same counts, see :class:`_CountsMemo`).
        ``kv_start``: int32 ``[B]`` left-padding offsets of this step, if any. In a graph-mode step the
        counts are the graph state's device tensors (:mod:`gaac_hf.cache.graphs`).
        """
        if self._graph is not None and self._graph.running:
            return self._graph.paged_kv(self, kv_start)
        self._deferred.flush()
        self._tail_room(self.geometry.block_size)  # the kernels read T-token tails (always so on CUDA)
        pk, pv = self._pools
        nbt, tlt = self._counts_memo.get(self.tails[_K].shape[0], self.num_blocks, self.tail_len, self.device)
        return PagedKV(
            pk.paged(self._tables[_K], self.tails[_K]), pv.paged(self._tables[_V], self.tails[_V]), nbt, tlt,
            self.geometry, kv_start,
            # tables keep spare capacity (they grow by doubling): size the kernel's splits by the live blocks
            active_blocks=max(self.num_blocks, 1),
        )

    def verify(self) -> dict:
        """Check every stored block of this layer (structure, and checksums if kept); ValueError if any is
        corrupt. Host syncs: an explicit check, not part of a decode step."""
        if not self.is_initialized:
            return {"slot_rows": 0, "raw_rows": 0, "checksums": self.checksums}
        self._deferred.flush()
        out = {}
        for kind, name in ((_K, "K"), (_V, "V")):
            try:
                got = self._pools[kind].verify(self._tables[kind][:, :, : self.num_blocks])
            except ValueError as e:
                raise ValueError(f"layer {self.layer_idx} {name}: {e}") from None
            out = {k: out.get(k, 0) + v for k, v in got.items() if k != "checksums"} | {"checksums": got["checksums"]}
        return out

    # -- statistics -------------------------------------------------------------------------------
    def _stats(self) -> dict:
        """Host-side byte counts plus the pools' device counters (``counts`` [2, 6], not synced here)."""
        if not self.is_initialized:
            z = torch.zeros(6, dtype=torch.int64)
            return {"fixed": 0, "slot_rows": 0, "bf16": 0, "allocated": 0, "counts": [z, z], "encoded": 0, "checksums": False,
                    "tail_tokens": 0, "tokens": 0}
        self._deferred.flush()
        b, h = self.tails[_K].shape[:2]
        g = self.geometry
        table_bytes = b * h * self.num_blocks * self._tables[_K].element_size()
        tail_bytes = b * h * self.tail_len * g.head_dim * 2
        v3 = {"resident_v3": 2 * (table_bytes + tail_bytes) + sum(p.resident_bytes() for p in self._pools)} \
            if self.format_version in (3, 4) else {}
        return v3 | {
            "fixed": 2 * (table_bytes + tail_bytes),  # + slot rows and raw rows, counted after the sync
            "checksums": self.checksums,
            "slot_rows": sum(p.n_slots for p in self._pools),
            "bf16": 2 * b * h * self.get_seq_length() * g.head_dim * 2,
            "allocated": sum(p.allocated_bytes() for p in self._pools)
            + sum(tb.numel() * tb.element_size() for tb in self._tables) + sum(tl.numel() * 2 for tl in self.tails),
            "counts": [p.counts for p in self._pools],
            "encoded": sum(p.encoded_blocks for p in self._pools),
            "tail_tokens": self.tail_len,
            "tokens": self.get_seq_length(),
        }
