"""GAAC pages inside transformers' continuous batching, release 5.17 (per-layer tensors).

In 5.17 ``PagedAttentionCache`` (``generation/continuous_batching/cache.py``) owns one BF16 tensor per
layer of a group, ``[(num_blocks + 2) * block_size, H, D]`` (the last two blocks are the read and write
trash), a ``BlockManager`` of block ids and one allocator per layer group
(``cache_manager.FullAttentionCacheAllocator``) whose block tables turn into token rows
``block * block_size + p``; its ``update()`` (called by ``paged|sdpa``) writes and reads those rows.

:class:`GAACPagedAttentionCache517` keeps that engine and changes what a block is:

* the per-layer tensors hold only the BF16 *frames* (open blocks, ``open_pages`` of them plus the two
  trash blocks, exactly where the engine puts its trash), so they are built by the engine itself with
  ``num_blocks = open_pages``;
* the engine's block ids are GAAC blocks (``BlockManager`` of the budget's block count), each with a
  slot area in one byte tensor (:class:`~gaac_hf.cache.pages.PageStore`), and admission also needs a
  free frame per new block;
* its allocator and ``update()`` run :class:`~.batch.BatchPages`: rows ``frame * block_size + p`` for
  BF16 blocks, scratch rows for compressed ones, encoding of filled blocks inside the forward.

The model must run ``paged|sdpa`` (:func:`~gaac_hf.integrations.serving.gaac_serving` switches it for the
``with`` block and back): 5.17 would otherwise switch a model to FlashAttention, whose decode path
reads block tables directly. One symbol is patched: ``continuous_api.PagedAttentionCache``.
"""
from __future__ import annotations

import torch
from transformers.generation.continuous_batching import cache as tf_cache
from transformers.generation.continuous_batching.cache_manager import BlockManager, FullAttentionCacheAllocator

from ...cache.pages import TRASH_FRAMES, PageStore
from .batch import BatchPages, check_engine_config


class GAACFullAttentionAllocator517(FullAttentionCacheAllocator):
    """The 5.17 full-attention allocator over GAAC blocks (indices from :class:`BatchPages`)."""

    def __init__(self, index: int, block_size: int, store: PageStore, batch: BatchPages) -> None:
        super().__init__(index, block_size, allow_block_sharing=False)
        self.store, self.batch = store, batch

    def allocate_blocks(self, n_blocks: int, request_id: str, block_manager: BlockManager) -> int | None:
        before = len(self.block_table.get(request_id, []))
        n = super().allocate_blocks(n_blocks, request_id, block_manager)
        if n is None:
            return None
        self.batch.admitted(request_id, self.block_table[request_id][before:])
        return n

    def free_blocks(self, request_id: str, block_manager: BlockManager) -> None:
        self.batch.freed(request_id, self.block_table.get(request_id, []))
        super().free_blocks(request_id, block_manager)

    def get_read_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        return self.batch.read_rows(self.batch.table(self.block_table, request_id), past_length, query_length)

    def get_write_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        return self.batch.write_rows(self.batch.table(self.block_table, request_id), past_length, query_length)

    def fill_block_table(self, request_id, past_length, query_length, block_table) -> None:
        raise NotImplementedError("GAAC serving has no block-table decode path yet")

    def fork_blocks(self, parent_request_id, children_request_ids, block_manager):
        raise NotImplementedError("GAAC serving does not fork requests (num_return_sequences > 1) yet")


class GAACPagedAttentionCache517(tf_cache.PagedAttentionCache):
    """The 5.17 engine's paged cache with GAAC blocks (see the module docstring). The GAAC settings
    come from ``_gaac``, set on a subclass by :func:`~gaac_hf.integrations.serving.gaac_serving`."""

    _gaac: dict = {}

    def __init__(self, config, continuous_batching_config, device, distributed_helper, tp_plan, dtype=torch.float16) -> None:
        settings = self._gaac
        if not settings:
            raise RuntimeError("GAACPagedAttentionCache517 is built by the engine inside gaac_hf.integrations.serving.gaac_serving")
        check_engine_config(continuous_batching_config)
        if dtype != torch.bfloat16:
            raise ValueError(f"GAAC serving stores bfloat16 K/V losslessly; the model runs in {dtype}")
        layer_groups, group_types = tf_cache.group_layers_by_attn_type(config)
        if group_types != ["full_attention"]:
            raise ValueError("GAAC serving on transformers 5.17 takes models whose layers are all full attention")
        if distributed_helper.tp_size > 1:
            raise ValueError("tensor parallel serving is not supported by GAAC yet")
        usable = settings["frames"] - TRASH_FRAMES
        blocks = settings["num_blocks"]
        # the engine builds its per-layer tensors for `usable` blocks + its 2 trash blocks: the frames
        continuous_batching_config.num_blocks = usable
        try:
            super().__init__(config, continuous_batching_config, device, distributed_helper, tp_plan, dtype)
        finally:
            continuous_batching_config.num_blocks = blocks
        page = self.block_size
        store = PageStore(settings["table"], layer_groups[0], page, device, settings["slot_bytes"])
        slots = torch.zeros(blocks * store.layout.layers * store.layout.slot_bytes, dtype=torch.uint8, device=device)
        store.bind(slots, blocks, usable + TRASH_FRAMES, layer_frames=list(zip(self.key_cache, self.value_cache)))
        self.gaac_store = store
        self.batch = BatchPages(store, (usable + TRASH_FRAMES) * page, fused_group=settings.get("fused_group"))
        self.num_blocks, self.num_pages = blocks, blocks * page
        self._block_manager = BlockManager(blocks, page, tp_on=False)
        self.group_cache_managers = [GAACFullAttentionAllocator517(0, page, store, self.batch)]
        self.use_prefix_sharing = False
        settings["session"].caches.append(self)

    def will_allocation_be_successful(self, num_requested_blocks: int, allocated_blocks: int) -> bool:
        """The engine's check, and a free frame for every new block."""
        return (num_requested_blocks <= self.gaac_store.free_frames
                and super().will_allocation_be_successful(num_requested_blocks, allocated_blocks))

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        group_idx, pos = self.layer_index_to_group_indices[layer_idx]
        k, v = (x.transpose(1, 2).squeeze(0) for x in (key_states, value_states))
        return self.batch.layer_step(pos, k, v, read_index[group_idx], write_index[group_idx])

    def gaac_stats(self) -> dict:
        """Bytes of the compressed pool (:meth:`PageStore.stats`) and the engine's block counts."""
        return dict(self.gaac_store.stats(), gaac_blocks=self.num_blocks, preemptions=self.batch.preemptions)
