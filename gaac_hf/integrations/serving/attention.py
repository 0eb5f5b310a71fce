"""Decode steps of GAAC serving through the fused v3 kernel (``gaac_serving(..., fused_decode=True)``).

The engine runs its own attention function on the K/V its cache's ``update()`` returns. For a decode
step the page store can leave the layer's pages as a :class:`~gaac_hf.kernels.paged.PagedKV` instead
(:meth:`~.batch.BatchPages.layer_step`); the wrappers here take it and run
:func:`~gaac_hf.kernels.cuda.fused_attention.gaac_decode_attention_v3` on the packed queries, and call the
engine's function unchanged otherwise. Inside the ``with`` block the wrapper replaces one entry of
transformers' ``AttentionInterface`` mapping (``"sdpa"`` on 5.23-5.25, ``"paged|sdpa"`` on 5.17);
:func:`~gaac_hf.integrations.serving.gaac_serving` puts the original back on exit.

How the PagedKV reaches the attention call: 5.23-5.25 pass one kwargs dict to ``cache.update`` and then
to the attention function, so the cache's ``update`` puts it there under :data:`FUSED_KWARG`; 5.17's
paged attention function calls ``cache.update`` itself, so its wrapper asks the batch directly.
"""
from __future__ import annotations

import torch

#: the kwargs key a 5.23-5.25 cache's update() leaves the layer's PagedKV under
FUSED_KWARG = "gaac_paged_kv"


def decode_attention(q: torch.Tensor, paged, scaling: float | None) -> torch.Tensor:
    """The fused v3 kernel: q BF16 ``[N, Hq, D]`` over ``paged`` -> ``[N, Hq, D]``."""
    from ...kernels.cuda.fused_attention import gaac_decode_attention_v3

    return gaac_decode_attention_v3(q, paged, scale=scaling)


def fused_call(query: torch.Tensor, paged, scaling: float | None) -> torch.Tensor:
    """query BF16 ``[1, Hq, N, D]`` (one new token per request, in the batch's order) -> ``[1, N, Hq, D]``."""
    q = query[0].transpose(0, 1).contiguous()  # [N, Hq, D]
    if q.shape[0] != paged.num_blocks.shape[0]:
        raise RuntimeError(f"GAAC serving: {q.shape[0]} queries for a decode step of {paged.num_blocks.shape[0]} requests")
    return decode_attention(q, paged, scaling).unsqueeze(0)


def sdpa_524(original):
    """The 5.23-5.25 ``"sdpa"`` entry: the fused kernel when the cache left a PagedKV, else ``original``."""
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        paged = kwargs.pop(FUSED_KWARG, None)
        if paged is not None:
            return fused_call(query, paged, scaling), None
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    attention.gaac_wraps = original
    return attention


def paged_sdpa_517(original):
    """The 5.17 ``"paged|sdpa"`` entry: ``cache.update`` as 5.17's own function calls it, then the fused
    kernel when the batch left a PagedKV, else the rest of 5.17's function (SDPA on the packed K/V with
    the engine's mask), written out because it calls ``update`` itself."""
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        cache = kwargs.pop("cache", None)
        if cache is None or not hasattr(cache, "batch"):  # not a GAAC engine: 5.17's own function
            if cache is not None:
                kwargs["cache"] = cache
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                                  read_index=kwargs["read_index"], write_index=kwargs["write_index"])
        paged = cache.batch.take_fused()
        if paged is not None:
            return fused_call(query, paged, scaling), None
        key, value = (x.transpose(0, 1).unsqueeze(0) for x in (key, value))
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1:
            key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            query.contiguous(), key.contiguous(), value.contiguous(), attn_mask=attention_mask, dropout_p=dropout,
            scale=scaling, is_causal=False)
        return out.transpose(1, 2).contiguous(), None

    attention.gaac_wraps = original
    return attention
