"""What an attention call asks for, as the paths over compressed blocks see it (one place for the
checks the fused v2 / v3 and tiled paths share; any call they decline takes decode + SDPA)."""
from __future__ import annotations

import torch

#: Attention kwargs no path over compressed blocks implements: their presence means decode + SDPA.
UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")


def plain_call(layer, query: torch.Tensor, attention_mask, kwargs: dict) -> bool:
    """True for a plain softmax attention call over ``layer``: no unsupported kwarg, a bool mask
    ``[B, 1, Sq, kv_len]`` or none, and query heads a multiple of the layer's kv heads."""
    if any(kwargs.get(k) is not None for k in UNSUPPORTED_KWARGS):
        return False
    if attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.dim() != 4
                                       or attention_mask.shape[1] != 1):
        return False
    return query.shape[1] % layer.tails[0].shape[1] == 0
