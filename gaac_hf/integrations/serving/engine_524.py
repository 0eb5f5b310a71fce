"""GAAC pages inside transformers' continuous batching, releases 5.23-5.25 (sectors and allocators).

In these releases ``PagedAttentionCache`` (``generation/continuous_batching/cache.py``) cuts one flat
byte tensor into sectors and hands them to one *allocator* per attention type; the allocator of the
full-attention layers (``FullAttentionCacheAllocator``) owns the block tables, turns them into read /
write token indices, and its ``update()`` writes the new K/V and returns the K/V attention reads.
No public hook changes the KV format, so this module supplies:

* :class:`GAACFullAttentionAllocator`: the full-attention allocator over a
  :class:`~gaac_hf.cache.pages.PageStore`. Its blocks are compressed *slots* (``bytes_per_block`` =
  the slot size, so the same bytes hold more blocks and the engine's own scheduler admits and
  preempts on the compressed pool's real free space); open blocks are written into BF16 *frames*;
  a block the engine's write fills is encoded layer by layer inside the forward and its frame given
  back; reads return the full K/V (frames as they are, compressed pages decoded into a per-layer
  scratch), so attention is the engine's own ``sdpa`` and every K/V bit is the BF16 cache's.
* :class:`GAACPagedAttentionCache`: the engine's cache with that allocator for the full-attention
  layers (a subclass: the sliding-window allocator, sectors, memory handler are the engine's), whose
  admission also counts free frames.

The one symbol patched, by :func:`gaac_hf.integrations.serving.gaac_serving` and only inside it, is
``transformers.generation.continuous_batching.continuous_api.PagedAttentionCache``.

Not supported here (refused with a message, or switched off by the serving config): block and prefix
sharing (a shared block's slot would need reference counts on frames), forking for parallel
sampling (``num_return_sequences > 1``), CPU offloading of preempted requests (they are soft-reset:
freed and recomputed, which the engine does when its CPU swap pool is off), the decode fast path
with block tables (flash only), async batching and CUDA graphs (a close runs host code between layers).
"""
from __future__ import annotations

import torch
from transformers.generation.continuous_batching import cache as tf_cache
from transformers.generation.continuous_batching.cache_allocators import FULL_ATTENTION, FullAttentionCacheAllocator

from ...cache.pages import PageStore
from .attention import FUSED_KWARG
from .batch import BatchPages, check_engine_config


class GAACFullAttentionAllocator(FullAttentionCacheAllocator):
    """Full-attention allocator whose blocks are GAAC slots (see the module docstring).

    Token addressing of the indices it emits: rows ``f * stride + p`` of the page store's frame
    views for BF16 blocks (``stride`` = 2 * layers * page_size, as the engine's own), and
    ``scratch_base + s * page_size + p`` for the s-th compressed block read by this batch.
    """

    supports_block_sharing = False
    supports_block_table = False

    def __init__(self, index, config, num_key_value_heads, cache_dtype, page_size, layer_indices, allow_block_sharing,
                 *, store: PageStore, num_frames: int, fused_group: int | None = None) -> None:
        if cache_dtype != torch.bfloat16:
            raise ValueError(f"GAAC serving stores bfloat16 K/V losslessly; the model runs in {cache_dtype}: load it with "
                             "dtype=torch.bfloat16")
        if num_key_value_heads != store.layout.kv_heads:
            raise ValueError(f"the calibration table has {store.layout.kv_heads} kv heads, the engine {num_key_value_heads} "
                             "(tensor parallel serving is not supported by GAAC yet)")
        self.head_dim, self.num_key_value_heads, self.cache_dtype = store.layout.head_dim, num_key_value_heads, cache_dtype
        self.store, self.num_frames, self.fused_group = store, num_frames, fused_group
        self._before_cache_tensor_init(index=index, layer_indices=layer_indices, tokens_per_page=page_size,
                                       bytes_per_page=store.layout.slot_bytes, allow_block_sharing=False)
        self.batch = None  # BatchPages, once the store is bound
        self._pos = {layer: i for i, layer in enumerate(layer_indices)}

    # -- memory -----------------------------------------------------------------------------------
    def register_cache_tensor(self, bytes_per_sector, non_trash_bytes, cache_tensor, pool) -> None:
        self._copy_view = cache_tensor.view(-1, self.bytes_per_block)
        self._after_cache_tensor_init(non_trash_bytes, bytes_per_sector, cache_tensor, pool)
        total_blocks = cache_tensor.numel() // self.bytes_per_block  # block ids count the trash sectors too
        self.store.bind(cache_tensor.view(-1), total_blocks, self.num_frames)
        self.write_trash_index = self.store.frame_stride  # frame 1 (frame 0: the read trash, row 0)
        self.batch = BatchPages(self.store, self.num_frames * self.store.frame_stride, fused_group=self.fused_group)

    def needs_new_sectors(self, request_id: str, past_length: int, query_length: int) -> int:
        """The engine's count, or more sectors than exist when the new blocks find no free frame (the
        request then waits or the engine preempts, as for a full cache)."""
        if self.needs_new_blocks(request_id, past_length, query_length) > self.store.free_frames:
            return self.pool.num_sectors + 1
        return super().needs_new_sectors(request_id, past_length, query_length)

    def allocate_cache_to_request(self, request_id: str, past_length: int, query_length: int) -> None:
        before = len(self.block_table.get(request_id, []))
        super().allocate_cache_to_request(request_id, past_length, query_length)
        self.batch.admitted(request_id, self.block_table[request_id][before:])

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        self.batch.freed(request_id, self.block_table.get(request_id, []))
        super().free_blocks(request_id, no_cache)

    def fork_blocks(self, source_request_id, dest_request_id, past_length):
        raise NotImplementedError("GAAC serving does not fork requests (num_return_sequences > 1) yet")

    def copy_blocks(self, source_block_ids, dest_block_ids) -> None:
        raise NotImplementedError("GAAC serving does not copy blocks (forks, CPU offloading) yet")

    # -- indices and the forward (BatchPages) ---------------------------------------------------------
    def get_write_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        return self.batch.write_rows(self.batch.table(self.block_table, request_id), past_length, query_length)

    def get_read_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        return self.batch.read_rows(self.batch.table(self.block_table, request_id), past_length, query_length)

    def fill_block_table(self, request_id, past_length, query_length, block_table) -> None:
        raise NotImplementedError("GAAC serving has no block-table decode path yet (supports_block_table is False)")

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        """Write this layer's new K/V ``[q, H, D]``, encode the pages this batch filled, return the K/V
        attention reads ``[len(read_index), H, D]`` (:meth:`BatchPages.layer_step`)."""
        return self.batch.layer_step(self._pos[layer_idx], key_states, value_states, read_index, write_index)

    def get_cache_for_block_table(self, layer_idx: int):
        raise NotImplementedError("GAAC serving has no block-table decode path yet")


class GAACPagedAttentionCache(tf_cache.PagedAttentionCache):
    """The engine's paged cache with :class:`GAACFullAttentionAllocator` for full-attention layers.

    Built by the engine with its usual arguments; the GAAC settings come from the class attributes a
    :func:`~gaac_hf.integrations.serving.gaac_serving` context sets on a subclass (``_gaac``: the
    calibration table, slot bytes, frames)."""

    _gaac: dict = {}

    def __init__(self, config, continuous_batching_config, device, distributed_helper, dtype=torch.float16,
                 model_supports_logits_to_keep: bool = False) -> None:
        settings = self._gaac
        if not settings:
            raise RuntimeError("GAACPagedAttentionCache is built by the engine inside gaac_hf.integrations.serving.gaac_serving")
        check_engine_config(continuous_batching_config)
        layer_types = tf_cache.group_layers_by_attn_type(config)
        if FULL_ATTENTION not in layer_types:
            raise ValueError("GAAC serving compresses full-attention layers; this model has none")
        store = PageStore(settings["table"], layer_types[FULL_ATTENTION], continuous_batching_config.page_size, device,
                          settings["slot_bytes"])
        self.gaac_store = store
        frames = settings["frames"]

        class _Allocator(GAACFullAttentionAllocator):
            def __init__(self, **kw):
                super().__init__(**kw, store=store, num_frames=frames, fused_group=settings.get("fused_group"))

        sectors = settings["num_blocks"]

        class _Sizes(tf_cache.PagedAttentionMemoryHandler):
            # a sector is one GAAC block (lcm(L * slot_bytes, 128) = L * slot_bytes): the engine's tensor
            # holds exactly the blocks the budget pays for
            def num_sectors_from_config(self) -> int:
                return sectors

        # only while the engine builds its allocators and sizes its tensor
        saved = tf_cache.ATTN_TYPE_TO_ALLOCATOR[FULL_ATTENTION], tf_cache.PagedAttentionMemoryHandler
        tf_cache.ATTN_TYPE_TO_ALLOCATOR[FULL_ATTENTION], tf_cache.PagedAttentionMemoryHandler = _Allocator, _Sizes
        try:
            super().__init__(config, continuous_batching_config, device, distributed_helper, dtype,
                             model_supports_logits_to_keep)
        finally:
            tf_cache.ATTN_TYPE_TO_ALLOCATOR[FULL_ATTENTION], tf_cache.PagedAttentionMemoryHandler = saved
        if self.bytes_per_sector != store.layout.layers * store.layout.slot_bytes:
            raise RuntimeError(f"GAAC serving expected one block per sector, got {self.bytes_per_sector} bytes per sector "
                               "(a model with sliding-window layers too: not supported yet)")
        settings["session"].caches.append(self)

    def update(self, key_states, value_states, layer_idx, kwargs):
        """The engine's update; a full-attention decode step that left its pages for the fused kernel
        (:meth:`~.batch.BatchPages.layer_step`) hands them to the attention call through ``kwargs``
        (:data:`~.attention.FUSED_KWARG`), which the engine passes on to it."""
        out = super().update(key_states, value_states, layer_idx, kwargs)
        allocator = self.layer_to_allocator[layer_idx]
        if isinstance(allocator, GAACFullAttentionAllocator):
            paged = allocator.batch.take_fused()
            if paged is not None:
                kwargs[FUSED_KWARG] = paged
        return out

    def count_storable_requests(self, list_blocks_needed: list[dict[str, int]]) -> int:
        """The engine's count, limited by the free frames (each new block opens one)."""
        n = super().count_storable_requests(list_blocks_needed)
        frames = self.gaac_store.free_frames
        for i, need in enumerate(list_blocks_needed[:n]):
            frames -= need.get(FULL_ATTENTION, 0)
            if frames < 0:
                return i
        return n

    def gaac_stats(self) -> dict:
        """Bytes of the compressed pool (:meth:`PageStore.stats`) and of the engine's whole cache tensor."""
        full = self.cache_allocators[FULL_ATTENTION]
        return dict(self.gaac_store.stats(), cache_tensor_bytes=self.cache_tensor.numel(), gaac_blocks=self.num_sectors,
                    preemptions=full.batch.preemptions)
