"""Decode steps of format-v3 and format-v4 layers on Hopper: the fused CUDA kernels over the compressed blocks.

:func:`takes` says whether a GAAC attention call runs :func:`fused_v3_attention`, which hands the
layer's :class:`~gaac_hf.kernels.paged.PagedKV` (v3 pools, int64 block tables, the BF16 tail,
device-side counts) to :func:`gaac_hf.kernels.cuda.fused_attention.gaac_decode_attention_v3`. The
kernel decodes each compressed tile once for the whole GQA group and runs the BF16 twin's attention
arithmetic on it, so its output is bit-identical to ``kernels/cuda/decode_attention.cu`` on the
decoded K/V at the same launch (``tests/test_cuda_fused.py``, ``tests/test_cache_v3_gpu.py``).

:func:`why_unavailable` is the one place that decides whether the kernel can serve a layer (the
``cuda`` extra installed, a Hopper GPU, a head_dim and GQA group it is built for); the cache uses it
to choose format v3 by default (``pool_v3.default_format``) and to say once why a v3 layer on CUDA
falls back to decode + SDPA.

Format v4 layers (``GAACCache(format_version=4)``) run
:func:`gaac_hf.kernels.cuda.fused_attention_v4.gaac_decode_attention_v4` instead: register tiles, no
producer warps, bit-identical to the same BF16 kernel at its launch (``tests/test_v4_gpu.py``). The layer
flag ``fused_v3`` means "the fused CUDA kernel of this layer's format serves its decode steps".
"""
from __future__ import annotations

import warnings

import torch

from ..format.v4 import KERNEL_HEAD_DIMS
from .calls import plain_call

#: head_dims the fused kernels are built for, per format (others decode + SDPA)
HEAD_DIMS = (64, 128, 256)
HEAD_DIMS_V4 = KERNEL_HEAD_DIMS
_REPORTED: set = set()


def _kernel_module(format_version: int = 3):
    """``gaac_hf.kernels.cuda.fused_attention`` (v3) or ``fused_attention_v4``, or the reason it cannot be imported."""
    try:
        if format_version == 4:
            from ..kernels.cuda import fused_attention_v4 as mod
        else:
            from ..kernels.cuda import fused_attention as mod
    except Exception as exc:  # noqa: BLE001 - an optional backend must never break attention
        return None, f"the CUDA kernels cannot be imported ({type(exc).__name__}: {exc})"
    return mod, None


def why_unavailable(device: torch.device, head_dim: int | None = None, group: int | None = None,
                    format_version: int = 3) -> str | None:
    """None when the fused kernel of ``format_version`` (3 or 4) can run decode steps on ``device`` for this
    head_dim and GQA group (query heads per kv head); otherwise the reason, in words."""
    device = torch.device(device)
    name = f"fused v{format_version} kernel"
    if device.type != "cuda":
        return f"{device.type} device (the {name} is CUDA C++)"
    mod, err = _kernel_module(format_version)
    if mod is None:
        return err
    from ..kernels.cuda import runtime

    reason = runtime.why_unavailable(device)
    if reason is not None:
        return reason
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"compute capability {major}.{minor}: the {name} is built for Hopper (sm_90a: mbarrier waits)"
    if format_version == 4:
        if head_dim is not None and head_dim not in HEAD_DIMS_V4:
            return f"head_dim {head_dim}: the fused v4 kernel takes {HEAD_DIMS_V4}"
        if group is not None and (group > 16 or (head_dim == 256 and group > 8)):
            return f"{group} query heads per kv head: the fused v4 kernel takes up to 16 (8 at head_dim 256)"
        return None
    if head_dim is not None and head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim}: the fused v3 kernel takes {HEAD_DIMS}"
    if group is not None and (group > 16 or (head_dim == 256 and group > 8)):
        return f"{group} query heads per kv head: the fused v3 kernel takes up to 16 (8 at head_dim 256)"
    return None


def report_fallback_once(layer, reason: str) -> None:
    """One warning per (reason, cache configuration) that v3 / v4 decode steps on CUDA run decode + SDPA."""
    version = getattr(layer, "format_version", 3)
    key = (reason, layer.geometry.head_dim, version)
    if key in _REPORTED:
        return
    _REPORTED.add(key)
    warnings.warn(f"GAACCache format v{version} on CUDA: decode steps run decode + SDPA, not the fused "
                  f"kernel: {reason}",
                  RuntimeWarning, stacklevel=3)


def takes(layer, query: torch.Tensor, attention_mask, training_dropout: bool, kwargs: dict) -> bool:
    """Whether this GAAC attention call runs :func:`fused_v3_attention` (a v3 or v4 layer on CUDA whose
    kernel is available, q_len 1, a left-padding bool mask or none, no unsupported attention kwargs)."""
    if not query.is_cuda or getattr(layer, "format_version", 2) not in (3, 4) or not layer.fused or training_dropout:
        return False
    if query.shape[2] != 1 or query.dtype != torch.bfloat16:
        return False
    if not getattr(layer, "fused_v3", False):
        return False
    return plain_call(layer, query, attention_mask, kwargs)


def fused_v3_attention(query: torch.Tensor, layer, kv_start: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """One decode step of ``query`` BF16 ``[B, Hq, 1, D]`` over every token of the v3 or v4 ``layer``.

    kv_start: int32 ``[B]`` masked (left-padding) positions per row, or None.
    Returns BF16 ``[B, 1, Hq, D]`` (the layout attention functions return)."""
    q = query[:, :, 0, :]
    if not q.is_contiguous():
        q = q.contiguous()
    if layer.format_version == 4:
        from ..kernels.cuda.fused_attention_v4 import gaac_decode_attention_v4 as attend
    else:
        from ..kernels.cuda.fused_attention import gaac_decode_attention_v3 as attend
    return attend(q, layer.paged_kv(kv_start), scale=scaling).unsqueeze(1)
