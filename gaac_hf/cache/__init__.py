"""GAACCache: a transformers ``Cache`` that stores full-attention KV as lossless GAAC blocks.

Layout (per full-attention layer, per kind K/V), shapes with B = batch rows, H = kv-heads,
T = ``geometry.block_size``, D = head_dim:

* ``slots``  uint8 ``[cap_slots, slot_bytes]``: a growable pool of encoded blocks' planes (append-only),
  with ``esc_start`` int64 ``[cap_slots]`` pointing at each block's escape stream in ``heap`` (uint8,
  the streams at their exact lengths: format v2, ``docs/FORMAT.md``).
* ``raw``    bf16 ``[cap_raw, T, D]``: blocks whose encoding did not fit a slot (``fits == False``).
* ``table``  int32 ``[B, H, cap_blocks]``: block j of row b, head h is slot ``e`` if ``e >= 0`` and
  raw block ``-e - 1`` otherwise. Only ``[:, :, :num_blocks]`` is meaningful.
* ``tail``   bf16 ``[B, H, T, D]``: the last, incomplete block (``tail_len < T`` tokens), uncompressed.

Fill-then-finalize: tokens go to the tail; whenever a block fills, all complete blocks of all rows and
heads are encoded with one :func:`~gaac_hf.codec.encode_blocks` call and appended to the pool; they are
never re-encoded. Beam search (``reorder_cache``), ``batch_repeat_interleave`` and
``batch_select_indices`` only re-index the tables and the tail: beams share pool entries.

How attention reads the blocks is described in :mod:`gaac_hf.cache.attention`: ``update()`` returns the
full decompressed K/V unless the live model config selects the GAAC attention, in which case it
returns a tail carrier and the attention function reads this layer directly.

Host syncs: none in decode steps (raw-fallback rows are placed on the device and the host tracks an
upper bound refreshed from a non-blocking copy, see :class:`_BlockPool`). When a prefill (or a run
of long escape streams / raw fallbacks) outgrows the pools' headroom, the exact sizes K and V need
are copied to the host without blocking and the layer's blocks are stored at the next layer's
append (:class:`_DeferredStore`): the host then waits at most for the previous layer's encoder,
never drains the GPU queue inside a layer. A few syncs remain in the rare operations that compact

Modules, bottom up: :mod:`.compat` (transformers version shims), :mod:`.host` (host-sync helpers),
:mod:`.pool` (the storage of one kind), :mod:`.attention` (the attention function and its
registration), :mod:`.layer` (:class:`GAACLayer`), :mod:`.fp8_baseline` (:class:`FP8DynamicCache`, FP8
without GAAC), :mod:`.fp8` (:class:`GAACFP8Layer`: ``GAACCache(..., kv_dtype="fp8_e4m3" | "fp8_e5m2")``),
:mod:`.cache` (:class:`GAACCache`).
"""
from .attention import gaac_attention_forward, register, registered_names, unregister, uses_gaac_attention
from .cache import GAACCache
from .fp8 import GAACFP8Layer
from .fp8_baseline import FP8DynamicCache
from .layer import GAACLayer

__all__ = ["FP8DynamicCache", "GAACCache", "GAACFP8Layer", "GAACLayer", "gaac_attention_forward", "register",
           "registered_names", "unregister", "uses_gaac_attention"]
