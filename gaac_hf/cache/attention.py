"""The GAAC attention function for transformers, and its explicit registration.

How compressed KV reaches attention (the deliberate mechanism, see also :mod:`gaac_hf.cache`):

* transformers calls ``cache.update(k, v, layer_idx)`` in the attention module, then the attention
  function picked by ``config._attn_implementation``. Neither the cache object nor the layer index
  reaches the attention function, and the attention function's ``key``/``value`` are whatever
  ``update()`` returned.
* A :class:`~gaac_hf.cache.GAACLayer` decides per call what to return by looking at the live model
  config it was built with: if ``config._attn_implementation`` is a name registered by
  :func:`register` (default ``"gaac"``), ``update()`` returns only the uncompressed BF16 tail, as a
  fresh tensor object carrying ``_gaac_layer`` (the cache layer); :func:`gaac_attention_forward`
  finds that attribute and reads the compressed blocks itself. For any other attention
  implementation ("sdpa", "eager", ...), ``update()`` returns the full decompressed K/V, so a model
  that does not use GAAC attention is still correct (only slower). The config is read at every
  update, so ``model.set_attn_implementation(...)`` takes effect immediately.
* Safety net: a tail-only return that no GAAC attention call consumed (an attention function that
  bypasses this module) makes the layer's next ``update()`` raise instead of silently attending to a
  truncated context.

Paths inside :func:`gaac_attention_forward`:

* reference (any device, any q_len): decode every block stored by earlier steps with the reference
  codec, add raw-fallback blocks, the old tail and this step's new tokens (taken from update()'s
  input rather than decoded right after being encoded: a prefill decodes nothing), and call
  transformers' own ``sdpa_attention_forward`` with the same mask and kwargs, so logits are
  bit-identical to ``DynamicCache`` + ``"sdpa"``.
  On CUDA the blocks are decoded by ``decode_tables_triton`` straight through the block tables
  (``GAACLayer.full``); the attention itself is then the stock SDPA (cuDNN/flash), so this path is
  also the faster one for long contexts on the H200 (see ``FUSED_MAX_TOKENS``).
* tiled (format v3 layers on the CPU, q_len <= ``tiled.TILED_MAX_QUERY``, ``fused`` not False):
  :func:`gaac_hf.cache.tiled.tiled_attention`, the C++ tiled kernel over the compressed blocks.
* fused v3 (format v3 layers on Hopper with the ``cuda`` extra, q_len == 1): :mod:`gaac_hf.cache.fused_v3`,
  the CUDA C++ kernel decoding the compressed tiles in shared memory (bit-identical to the BF16 CUDA
  twin on the decoded K/V at the same launch). Format v3 is the default there.
* fused (CUDA, q_len == 1, kernel importable, format v2): :func:`_fused_decode`, the Triton decode kernel of
  ``gaac_hf.kernels.triton.attention`` reading slots directly. Falls back to the reference path when the
  kernel is missing or declines the call (returns None), and with ``GAACCache(fused="auto")``
  from ``FUSED_MAX_TOKENS`` cached tokens on.

Nothing is registered at import: :func:`register` / :func:`unregister` do it, idempotently.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import fused_v3 as _fused_v3
from .calls import UNSUPPORTED_KWARGS
from . import tiled as _tiled

# The fused Triton decode kernel is optional: without it every step takes the reference path. Any
# error, not only ImportError: a kernel module that cannot load must never break attention.
try:
    from ..kernels.triton import attention as _triton_attention
except Exception:  # noqa: BLE001
    _triton_attention = None

#: Default registration name. It must avoid "flash", "sdpa", "flex_attention" and "paged|": those
#: substrings switch on special branches inside transformers.
DEFAULT_NAME = "gaac"
_FORBIDDEN = ("flash", "sdpa", "flex_attention", "paged|")

# name -> (previous attention fn or None, previous mask fn or None), to make unregister() undo exactly.
_REGISTERED: dict[str, tuple[Any, Any]] = {}


def registered_names() -> frozenset[str]:
    """Attention-implementation names currently bound to :func:`gaac_attention_forward`."""
    return frozenset(_REGISTERED)


def uses_gaac_attention(config) -> bool:
    """True when ``config`` (the live model config) selects a GAAC-registered attention."""
    impl = getattr(config, "_attn_implementation", None)
    return isinstance(impl, str) and impl in _REGISTERED


def register(name: str = DEFAULT_NAME) -> str:
    """Register :func:`gaac_attention_forward` with transformers under ``name``.

    Registers both ``AttentionInterface`` (the attention function) and ``AttentionMaskInterface``
    (transformers' ``sdpa_mask``): without the mask registration ``create_causal_mask`` returns None
    for an unknown name and left padding is silently dropped. Call it before
    ``from_pretrained(..., attn_implementation=name)`` (transformers validates the name at load) or
    before ``model.set_attn_implementation(name)``. Idempotent; returns ``name``.
    """
    if not isinstance(name, str) or not name or any(s in name for s in _FORBIDDEN):
        raise ValueError(f"attention name {name!r} must be a non-empty string without any of {_FORBIDDEN}")
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    if name not in _REGISTERED:
        _REGISTERED[name] = (
            AttentionInterface._global_mapping.get(name),
            AttentionMaskInterface._global_mapping.get(name),
        )
    AttentionInterface.register(name, gaac_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def unregister(name: str = DEFAULT_NAME) -> None:
    """Undo :func:`register`: restore whatever ``name`` meant before (usually nothing). Idempotent."""
    if name not in _REGISTERED:
        return
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    prev_fn, prev_mask = _REGISTERED.pop(name)
    for iface, prev in ((AttentionInterface, prev_fn), (AttentionMaskInterface, prev_mask)):
        if prev is None:
            iface._global_mapping.pop(name, None)
        else:
            iface._global_mapping[name] = prev


def _sdpa() -> Callable:
    # Imported lazily: the stock function is the one DynamicCache + "sdpa" uses, so the reference
    # path inherits its exact arithmetic (GQA handling, is_causal rules, dispatch).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


# ---------------------------------------------------------------------------------------------
# fused decode hook
# ---------------------------------------------------------------------------------------------
def _fused_kernel():
    """The fused decode kernel module, or None when it is not importable (e.g. no Triton)."""
    return _triton_attention


#: With ``GAACCache(fused="auto")``, decode steps over at least this many cached tokens take the
#: decode-then-SDPA path (SDPA without its cuDNN backend, see :class:`_NoCudnn`) instead of the fused
#: kernel. GPU time on the H200 (Qwen3-8B shape, B=1, ``eval/results/attention_h200.json``): fused
#: 26.7 / 88.5 / 167.2 / 323.1 us vs decode-then-cuDNN 25.6 / 73.1 / 133.7 / 246.3 us at 4K / 16K / 32K
#: / 64K. Below 16K the gain is too small to pay for the extra launch and SDPA call on the host.
FUSED_MAX_TOKENS = 16384


def _auto_unfused(layer, kv_len: int) -> bool:
    """Whether a ``fused="auto"`` layer takes decode-then-SDPA for a decode step over ``kv_len`` tokens."""
    return layer.fused == "auto" and kv_len >= FUSED_MAX_TOKENS


class _NoCudnn:
    """Context: SDPA's cuDNN backend switched off, every other backend setting left as it is.

    For the decode-then-SDPA steps of ``fused="auto"``: with a KV length that grows by one each step,
    cuDNN's attention costs ~1.2 ms of host time per call on the H200 test VM (DynamicCache + cuDNN:
    69.6 ms wall per 36-layer step for 14.7 ms of GPU time, FA2 26.9 ms; ``lab/results/superseded/e2e_h200_auto.json``),
    more than its kernel saves over FA2 (76 vs 86 us at 64K). Those steps are then bit-identical to
    DynamicCache + sdpa under the same backend set. One flag read and two writes: ``torch.nn.attention.
    sdpa_kernel`` did the same job at ~60-90 us of host time per layer on that VM, 2-3 ms per step
    (``lab/results/superseded/host_ab_h200_*.json``, ``gaac_auto`` vs ``gaac_auto_nosdpactx``). Like
    ``sdpa_kernel``, it sets a process-wide flag for the duration of the call.
    """

    __slots__ = ("_prev",)

    def __enter__(self):
        self._prev = torch.backends.cuda.cudnn_sdp_enabled()
        if self._prev:
            torch.backends.cuda.enable_cudnn_sdp(False)
        return self

    def __exit__(self, *exc):
        if self._prev:
            torch.backends.cuda.enable_cudnn_sdp(True)
        return False


_no_cudnn = _NoCudnn


# Attention kwargs the fused kernel does not implement: their presence means "reference path".
_UNFUSED_KWARGS = UNSUPPORTED_KWARGS


# (mask, its version counter, kv_start) of the last mask seen: transformers passes one mask object to
# every layer of a forward, so the reduction runs once per step instead of once per layer. The
# identity check holds because the memo keeps the mask alive; _version catches in-place edits. The
# entry is one immutable tuple, read and replaced whole, so two threads (two models) cannot mix the
# fields of different masks.
_KV_START_MEMO: list = [None]


def _kv_start(attention_mask: torch.Tensor) -> torch.Tensor:
    """int32 ``[B]``: masked positions per row of a left-padding bool mask ``[B, 1, q, kv_len]``."""
    memo = _KV_START_MEMO[0]
    if memo is not None and memo[0] is attention_mask and memo[1] == attention_mask._version:
        return memo[2]
    kv_start = (~attention_mask[:, 0, -1, :]).sum(-1, dtype=torch.int32)
    _KV_START_MEMO[0] = (attention_mask, attention_mask._version, kv_start)
    return kv_start


def _fused_decode(module, query: torch.Tensor, layer, attention_mask, scaling: float | None, **kwargs):
    """Single-token decode over compressed blocks with the Triton kernel, or None.

    Args:
        query: ``[B, Hq, 1, D]`` on CUDA.
        layer: the :class:`~gaac_hf.cache.GAACLayer` (slots, block tables, tail).
        attention_mask: None or bool ``[B, 1, 1, kv_len]`` (True = attend). The kernel takes left
            padding as ``kv_start[b]`` = number of masked positions, so the mask must have the
            left-padding form (masked prefix, then all visible) that generate() builds; caches made
            with ``GAACCache(..., fused=False)`` always use the reference path.
    Returns:
        ``[B, 1, Hq, D]`` contiguous, or None when the kernel is missing or does not take this call
        (an attention variant it does not implement, a geometry it does not support).
    """
    if not layer.fused or any(kwargs.get(k) is not None for k in _UNFUSED_KWARGS):
        return None
    if _auto_unfused(layer, layer.get_seq_length()):
        return None  # decode-then-SDPA is faster there
    if layer.geometry.group_axis != "channel":
        return None
    kernel = _fused_kernel()
    if kernel is None or not hasattr(kernel, "gaac_decode_attention"):
        return None
    kv_start = None
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            return None
        kv_start = _kv_start(attention_mask)
    q = query[:, :, 0, :]  # [B, Hq, D]
    if not q.is_contiguous():
        q = q.contiguous()
    out = kernel.gaac_decode_attention(q, layer.paged_kv(kv_start), scale=scaling)
    return out.unsqueeze(1)  # [B, 1, Hq, D], the layout attention functions return


# ---------------------------------------------------------------------------------------------
# the attention function
# ---------------------------------------------------------------------------------------------
def gaac_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function over a GAAC cache layer.

    Args:
        query: ``[B, Hq, Sq, D]``.
        key, value: ``[B, Hkv, S, D]``: either ordinary tensors (no GAAC cache: plain SDPA), or the
            tail carriers returned by a GAAC layer's ``update()`` (``key._gaac_layer`` set).
        attention_mask: None or bool ``[B, 1, Sq, kv_len]`` from ``sdpa_mask``.
    Returns:
        (``[B, Sq, Hq, D]`` contiguous, None).
    """
    layer = getattr(key, "_gaac_layer", None)
    if layer is None:  # no GAAC cache (use_cache=False, DynamicCache, a stock sliding layer...)
        return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layer._awaiting_attention = False
    q_len, kv_len = query.shape[2], layer.get_seq_length()
    if q_len > kv_len:
        raise ValueError(f"GAAC attention: query has {q_len} tokens but the cache layer holds only {kv_len}")
    if attention_mask is not None and attention_mask.shape[-1] != kv_len:
        raise ValueError(
            f"GAAC attention: mask covers {attention_mask.shape[-1]} key positions but the cache layer holds "
            f"{kv_len}; the mask must come from the GAAC mask registration (gaac_hf.register())"
        )
    if attention_mask is not None and attention_mask.shape[-2] not in (1, q_len):
        raise ValueError(f"GAAC attention: mask has {attention_mask.shape[-2]} query rows for {q_len} query tokens")
    try:
        if _tiled.takes(layer, query, attention_mask, bool(module.training and dropout), kwargs):
            return _tiled.tiled_attention(query, layer, attention_mask, scaling), None
        if _fused_v3.takes(layer, query, attention_mask, bool(module.training and dropout), kwargs):
            kv_start = _kv_start(attention_mask) if attention_mask is not None else None
            return _fused_v3.fused_v3_attention(query, layer, kv_start, scaling), None
        if query.is_cuda and q_len == 1 and layer.format_version == 2 and not (module.training and dropout):
            out = _fused_decode(module, query, layer, attention_mask, scaling, **kwargs)
            if out is not None:
                return out, None
        k, v = layer.full_kv()
        if query.is_cuda and q_len == 1 and _auto_unfused(layer, kv_len):
            with _no_cudnn():
                return _sdpa()(module, query, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        return _sdpa()(module, query, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    finally:
        layer._recent = None  # drop this step's uncompressed input: only the compressed form stays
