"""One engine batch over a :class:`~gaac_hf.cache.pages.PageStore`: the part both engine adapters share.

An engine builds each batch's token indices on the host (per request: write indices for its new
tokens, read indices for its whole context), then runs the forward, in which every full-attention
layer writes its new K/V and reads K/V back. :class:`BatchPages` emits those indices in the store's
addressing and runs the layer step:

* write rows are always in frames (only open blocks are written); a write that fills a block puts
  it on the batch's *closing* list;
* read rows are frame rows for BF16 blocks and ``scratch_base + s * P + p`` for the s-th compressed
  block the batch reads;
* :meth:`layer_step` writes the layer's new K/V into the frames, encodes the closing blocks' pages of
  this layer, after the last layer gives their frames back, and returns the K/V attention reads:
  frame rows gathered as they are, compressed pages decoded into a scratch for this layer only.

A new batch starts at the first index request after the last layer of the previous forward ran
(engines that build batch N+1 while N runs, async batching, are not supported: the serving config
switches it off).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from ...cache.pages import PageStore

#: request ids remembered as freed, to tell a preemption (the same id admitted again) from an end
FREED_MEMORY = 4096


def check_engine_config(cfg) -> None:
    """Refuse an engine config GAAC pages cannot run under (a manager built without the config that
    :func:`~gaac_hf.integrations.serving.gaac_serving` yields)."""
    def on(value) -> bool:  # the engine resolves use_cuda_graph to a (varlen, decode) pair of booleans
        return any(value) if isinstance(value, (tuple, list)) else bool(value)

    wrong = [name for name in ("use_async_batching", "use_cuda_graph", "allow_block_sharing", "cpu_offload_space")
             if on(getattr(cfg, name, None))]
    if wrong:
        raise ValueError(f"GAAC serving cannot run with {', '.join(wrong)} set in the continuous batching config: pass "
                         "continuous_batching_config=serving.config (what gaac_serving yields) to generate_batch / "
                         "init_continuous_batching")


class BatchPages:
    """Closing and scratch lists of the current batch, for a store whose frames start every
    ``store.frame_stride`` rows and whose scratch rows start at ``scratch_base``."""

    def __init__(self, store: PageStore, scratch_base: int) -> None:
        self.store, self.scratch_base = store, scratch_base
        self.page = store.layout.page_size
        self.closing: list[int] = []   # blocks the current batch's writes fill
        self.scratch: list[int] = []   # compressed blocks the current batch reads, in scratch order
        self._done = False
        self._scratch_ids = None  # int64 tensor of ``scratch``, built at the batch's first read
        self._freed: OrderedDict = OrderedDict()  # the last FREED_MEMORY freed ids (a server sees unboundedly many)
        self.preemptions = 0  # requests that got blocks again after the engine freed theirs unfinished

    def _start_if_done(self) -> None:
        if self._done:
            self.closing, self.scratch, self._scratch_ids, self._done = [], [], None, False

    # -- requests --------------------------------------------------------------------------------
    def admitted(self, request_id: str, new_blocks: list[int]) -> None:
        """A request got ``new_blocks``: each opens a frame; if the engine had freed the request's
        blocks before, it was preempted."""
        for block in new_blocks:
            self.store.open_block(block)
        if self._freed.pop(request_id, False):
            self.preemptions += 1

    def freed(self, request_id: str, blocks: list[int]) -> None:
        """The engine freed a request's blocks (finished, failed or preempted: only a later admission
        of the same id tells a preemption)."""
        for block in blocks:
            self.store.free(block)
        if blocks:
            self._freed[request_id] = True
            if len(self._freed) > FREED_MEMORY:
                self._freed.popitem(last=False)

    # -- indices ---------------------------------------------------------------------------------
    @staticmethod
    def table(block_tables: dict, request_id: str) -> list[int]:
        """A request's block table from an allocator's ``block_table`` dict (the engine's error if none)."""
        table = block_tables.get(request_id)
        if table is None:
            raise ValueError(f"No block table found for request {request_id}")
        return table

    def _rows(self, block: int, start: int, stop: int, reading: bool) -> range:
        frame = self.store.frame_of(block)
        if frame is not None:
            base = frame * self.store.frame_stride
        elif reading:
            base = self.scratch_base + len(self.scratch) * self.page
            self.scratch.append(block)
        else:
            raise RuntimeError(f"GAAC serving: block {block} is compressed but the engine writes to it")
        return range(base + start, base + stop)

    def write_rows(self, table: list[int], past_length: int, query_length: int) -> list[int]:
        """Rows of a request's new tokens; records the blocks this write fills."""
        self._start_if_done()
        page, end = self.page, past_length + query_length
        rows: list[int] = []
        for b in range(past_length // page, (end - 1) // page + 1):
            lo = past_length - b * page if b == past_length // page else 0
            hi = min(end - b * page, page)
            rows.extend(self._rows(table[b], lo, hi, reading=False))
            if hi == page:
                self.closing.append(table[b])
        return rows

    def read_rows(self, table: list[int], past_length: int, query_length: int) -> list[int]:
        """Rows of a request's whole context (its new tokens included)."""
        self._start_if_done()
        page, total = self.page, past_length + query_length
        rows: list[int] = []
        for b in range(-(-total // page)):
            rows.extend(self._rows(table[b], 0, min(page, total - b * page), reading=True))
        return rows

    # -- the forward -------------------------------------------------------------------------------
    def layer_step(self, pos: int, key_states, value_states, read_index, write_index):
        """Layer position ``pos``: write ``[q, H, D]`` new K/V, close, and return the K/V attention reads
        ``[len(read_index), H, D]`` (bit-exact BF16), or the inputs when the batch reads nothing."""
        store = self.store
        views = [store.frame_view(pos, kind) for kind in (0, 1)]
        views[0].index_copy_(0, write_index, key_states)
        views[1].index_copy_(0, write_index, value_states)
        store.close(pos, self.closing)
        if pos == store.layout.layers - 1:
            store.finish_close(self.closing)
            self._done = True
        if read_index.numel() == 0:
            return key_states, value_states
        if not self.scratch:
            return torch.index_select(views[0], 0, read_index), torch.index_select(views[1], 0, read_index)
        if self._scratch_ids is None:  # one host-to-device copy per batch, not per layer
            self._scratch_ids = store.block_ids(self.scratch)
        decoded = store.read(pos, self._scratch_ids)  # K, V [n, P, H, D]
        in_frames = (read_index < self.scratch_base)[:, None, None]
        out = []
        for view, dec in zip(views, decoded):
            dec = dec.reshape(-1, *dec.shape[2:])
            a = torch.index_select(view, 0, read_index.clamp(max=view.shape[0] - 1))
            b = torch.index_select(dec, 0, (read_index - self.scratch_base).clamp(0, dec.shape[0] - 1))
            out.append(torch.where(in_frames, a, b))
        return out[0], out[1]
