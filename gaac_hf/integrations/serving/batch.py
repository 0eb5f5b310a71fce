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

Decode steps through the fused v3 kernel (``fused_group`` set: ``gaac_serving(..., fused_decode=True)``
on Hopper): when every request of a batch adds one token, pages are one v3 block per head, and each
request's blocks but its last are compressed, :meth:`layer_step` writes and closes as always but reads
nothing; it leaves the layer's :class:`~gaac_hf.kernels.paged.PagedKV` (the slot tensor, gathered block
tables, each request's last page as the tail) for the attention function to take (:meth:`take_fused`).
Other batches (prefill chunks, overflowed blocks) read decoded pages as before.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from ...cache.pages import DecodePlan, PageStore

#: request ids remembered as freed, to tell a preemption (the same id admitted again) from an end
FREED_MEMORY = 4096
#: tests only: a callable ``(store, layer_pos, plan, k, v)`` called at each decode step the fused kernel could
#: read, with the K/V the step decoded (it still returns them); tests/test_serving.py compares them with
#: ``store.paged_kv(layer_pos, plan)`` on the CPU, where the kernel cannot run. None in the product.
CHECK_PAGED = None


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

    def __init__(self, store: PageStore, scratch_base: int, fused_group: int | None = None) -> None:
        self.store, self.scratch_base = store, scratch_base
        self.fused_group = fused_group  # query heads per kv head when decode steps run the fused kernel
        self._requests: list[tuple[list[int], int]] = []  # (blocks, tokens) of each request read, in order
        self._max_query = 0
        self._plan: DecodePlan | bool | None = None  # this batch's decode plan; False: not a fused step
        self.fused_kv = None  # the current layer's PagedKV, until take_fused()
        self.fused_steps = 0  # layer steps that left a PagedKV
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
            self._requests, self._max_query, self._plan, self.fused_kv = [], 0, None, None

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
        self._max_query = max(self._max_query, query_length)
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
        self._requests.append((list(table[: -(-total // page)]), total))
        rows: list[int] = []
        for b in range(-(-total // page)):
            rows.extend(self._rows(table[b], 0, min(page, total - b * page), reading=True))
        return rows

    # -- decode steps through the fused kernel ------------------------------------------------------
    def decode_plan(self, new_tokens: int) -> DecodePlan | None:
        """This batch's :class:`DecodePlan` if it is a decode step the fused kernel can read (every
        request adds one token, pages are one v3 block per head, every block of a request but its last
        is compressed), else None. Built once per batch (one host-to-device copy)."""
        if self._plan is None:
            self._plan = self._build_plan(new_tokens) or False
        return self._plan or None

    def _build_plan(self, new_tokens: int) -> DecodePlan | None:
        store, reqs = self.store, self._requests
        if (self._max_query != 1 or not reqs or len(reqs) != new_tokens
                or store.layout.page_size != store.geometry.block_size):
            return None
        frames, counts = [], []
        for blocks, _ in reqs:
            if any(store.frame_of(b) is not None for b in blocks[:-1]):
                return None  # an overflowed block (BF16 in a frame): read decoded pages instead
            f = store.frame_of(blocks[-1])
            if f is None:
                return None
            frames.append(f)
            counts.append(len(blocks) - 1)
        width = max(1, max(counts))
        ids = [(blocks[:-1] + [blocks[0]] * width)[:width] for blocks, _ in reqs]
        host = torch.tensor([sum(ids, []) + frames + counts + [t - c * self.page for (_, t), c in zip(reqs, counts)]],
                            dtype=torch.int64)[0]
        dev = host.to(store.device)
        n, B = width * len(reqs), len(reqs)
        return DecodePlan(ids=dev[:n].view(B, width), frames=dev[n:n + B], num_blocks=dev[n + B:n + 2 * B].to(torch.int32),
                          tail_len=dev[n + 2 * B:].to(torch.int32), max_blocks=max(counts))

    def take_fused(self):
        """The PagedKV the last :meth:`layer_step` left for the fused kernel (once), or None."""
        kv, self.fused_kv = self.fused_kv, None
        return kv

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
        if self.fused_group is not None or CHECK_PAGED is not None:
            plan = self.decode_plan(int(write_index.numel()))
            if plan is not None and self.fused_group is not None:
                self.fused_kv = store.paged_kv(pos, plan)  # the attention function takes it: nothing to read
                self.fused_steps += 1
                return key_states, value_states
        else:
            plan = None
        k, v = self._read(pos, views, read_index)
        if plan is not None and CHECK_PAGED is not None:
            CHECK_PAGED(store, pos, plan, k, v)
        return k, v

    def _read(self, pos: int, views, read_index):
        """The K/V rows ``read_index`` of layer position ``pos``: frames as they are, compressed pages decoded."""
        store = self.store
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
