"""The FP8 KV cache without GAAC: the baseline an FP8 :class:`~gaac_hf.cache.GAACCache` must reproduce.

:class:`FP8DynamicCache` is a ``DynamicCache`` whose full-attention layers (:class:`FP8DynamicLayer`)
store keys and values as FP8 codes, uint8 ``[B, H, S, D]``, converted with a static per-(layer, K/V)
scale (:func:`~gaac_hf.codec.fp8.quantize_fp8`: ``(x.float() / scale).to(float8)``) and hand attention
the dequantized cache (:func:`~gaac_hf.codec.fp8.dequantize_fp8`: ``(codes.float() * scale).to(x.dtype)``),
every step including the prefill. Other layers (sliding window, ...) stay stock, as in ``GAACCache``.

How it differs from transformers' ``Fp8QuantizedLayer`` (5.23+), on purpose:

* the scale is static (from the calibration table, like vLLM's ``k_scale`` / ``v_scale``), not taken
  from the first prompt's amax: a cache whose scale follows the prompt would need the windows to
  follow it too (``eval/results/compression_fp8_smollm2-prompt.json`` measures that variant);
* the prefill attends to the dequantized values too (transformers returns the BF16 prompt K/V on the
  first update), so every token sees the same FP8 cache;
* E4M3 and E5M2 (transformers: E4M3 only). The conversion and dequantization arithmetic are the same.

Only the BF16 -> FP8 conversion approximates; a GAAC FP8 cache stores the same codes losslessly, so
generation through it is bit-identical to generation through this class (``tests/test_cache_fp8.py``).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from ..codec.fp8 import dequantize_fp8, quantize_fp8
from ..format.fp8 import FP8_TYPES


class FP8DynamicLayer(DynamicLayer):
    """One full-attention layer's K/V as FP8 codes: ``keys`` / ``values`` uint8 ``[B, H, S, D]``.

    DynamicLayer's crop, beam reorder and batch selection work on the codes unchanged (a per-tensor
    scale does not depend on rows or positions). No ``_layer_type``: it must not take over
    ``DynamicCache(config=...)`` (see :class:`~gaac_hf.cache.GAACLayer`).
    """

    def __init__(self, scale_k: torch.Tensor, scale_v: torch.Tensor, kv_dtype: str) -> None:
        super().__init__()
        if kv_dtype not in FP8_TYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(FP8_TYPES)}, got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        self.scales = (scale_k.to(torch.float32), scale_v.to(torch.float32))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self.out_dtype = key_states.dtype
        self.keys = torch.empty(b, h, 0, d, dtype=torch.uint8, device=self.device)
        self.values = torch.empty(b, h, 0, value_states.shape[-1], dtype=torch.uint8, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[B, H, q, D]`` K/V as FP8 codes; return the whole cache dequantized, ``[B, H, S, D]``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, quantize_fp8(key_states, self.scales[0], self.kv_dtype, saturate=True)], dim=-2)
        self.values = torch.cat([self.values, quantize_fp8(value_states, self.scales[1], self.kv_dtype, saturate=True)], dim=-2)
        return (dequantize_fp8(self.keys, self.scales[0], self.kv_dtype, self.out_dtype),
                dequantize_fp8(self.values, self.scales[1], self.kv_dtype, self.out_dtype))


class FP8DynamicCache(DynamicCache):
    """A DynamicCache storing full-attention K/V in FP8 with static per-tensor scales.

    Args:
        config: the model config.
        scales: an :class:`~gaac_hf.calibration.fp8.FP8Table` (its scales and FP8 format; ``kv_dtype``
            may be omitted) or float32 ``[L, 2]`` scales (then ``kv_dtype`` is required).
        kv_dtype: ``"fp8_e4m3"`` or ``"fp8_e5m2"``.
    """

    def __init__(self, config, scales, kv_dtype: str | None = None) -> None:
        table_dtype = getattr(scales, "dtype", None) if not isinstance(scales, torch.Tensor) else None
        if table_dtype is not None:  # an FP8Table
            if kv_dtype is not None:
                scales.check_dtype(kv_dtype)
            kv_dtype, scales = table_dtype, scales.scales
        if kv_dtype is None:
            raise ValueError("FP8DynamicCache(config, scales, kv_dtype): give kv_dtype with a scales tensor")
        super().__init__(config=config)
        if scales.dim() != 2 or scales.shape != (len(self.layers), 2):
            raise ValueError(f"scales must be [{len(self.layers)}, 2] (layer, K/V), got {tuple(scales.shape)}")
        for i, layer in enumerate(self.layers):
            if type(layer) is DynamicLayer:  # full attention; sliding-window and other layers stay stock
                self.layers[i] = FP8DynamicLayer(scales[i, 0], scales[i, 1], kv_dtype)
        self.kv_dtype = kv_dtype
