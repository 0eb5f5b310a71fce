"""One-launch tail append of a decode step's K and V (kernels/cuda/tail_append.cu), eager and graph-mode steps.

A GAAC layer's decode step (``GAACLayer.update``; graph mode: ``gaac_hf.cache.graphs``) writes the new token's
K and V rows into the BF16 tails at a position held on the device (eager steps: a one-element tensor the cache
fills once per step). Two ``index_copy_`` (eager: ``copy_``) calls did that: two kernels per layer.
:func:`tail_append` does both rows in one launch; :func:`takes` says when it applies (CUDA kernels
available, bf16, 16-byte aligned rows), otherwise the caller keeps ``index_copy_``.

Shapes: ``k``, ``v`` bf16 ``[B, H, 1, D]`` (any batch / head strides, channels dense); ``k_tail``,
``v_tail`` bf16 ``[B, H, T, D]`` contiguous; ``pos`` int64 ``[1]`` on the same device.
"""
from __future__ import annotations

import torch

from . import runtime

SOURCE = "tail_append.cu"
_VEC = 8  # bf16 values per 16-byte vector


_USABLE: dict = {}  # device -> whether the CUDA kernels run there (asked once: eager steps call takes() per layer)
_MODULES: dict = {}  # device -> the loaded kernel module


def _usable(device: torch.device) -> bool:
    if device not in _USABLE:
        _USABLE[device] = runtime.why_unavailable(device) is None
    return _USABLE[device]


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % _VEC == 0 for s in t.stride()[:2])


def takes(k: torch.Tensor, v: torch.Tensor, k_tail: torch.Tensor, v_tail: torch.Tensor) -> bool:
    """Whether :func:`tail_append` can write these rows (else use ``index_copy_``)."""
    if k.device.type != "cuda" or not _usable(k.device):
        return False
    b, h, t, d = k_tail.shape
    return (all(x.dtype == torch.bfloat16 for x in (k, v, k_tail, v_tail))
            and k.shape == v.shape == (b, h, 1, d) and v_tail.shape == k_tail.shape
            and d % _VEC == 0 and k.stride(-1) == 1 and v.stride(-1) == 1
            and _aligned(k) and _aligned(v) and k_tail.is_contiguous() and v_tail.is_contiguous()
            and k_tail.data_ptr() % 16 == 0 and v_tail.data_ptr() % 16 == 0)


def tail_append(k: torch.Tensor, v: torch.Tensor, k_tail: torch.Tensor, v_tail: torch.Tensor,
                pos: torch.Tensor) -> None:
    """``k_tail[:, :, pos] = k[:, :, 0]`` and the same for V, in one launch on the current stream (no host
    sync; capturable). Callers check :func:`takes` first; ``pos`` outside ``[0, T)`` traps on the device."""
    import numpy as np

    if pos.dtype != torch.int64 or pos.numel() != 1 or pos.device != k.device:
        raise ValueError(f"pos must be int64 [1] on {k.device}, got {pos.dtype} {tuple(pos.shape)} on {pos.device}")
    b, h, t, d = k_tail.shape
    vecs = d // _VEC
    pdl = runtime.pdl_requested()
    mod = _MODULES.get((k.device, pdl))
    if mod is None:  # once per device: eager steps launch this per layer, so no per-call compile-cache lookup
        mod = _MODULES[(k.device, pdl)] = runtime.load(SOURCE, {"GAAC_PDL": 1} if pdl else {}, k.device)
    threads = min(1024, 32 * -(-2 * vecs // 32))
    # the sources pass as raw addresses with their strides (runtime.launch refuses strided tensors, which it
    # would read as dense): strides in 16-byte vectors
    runtime.launch(mod, "gaac_tail_append", (b * h,), (threads,), 0,
                   np.uint64(k.data_ptr()), np.uint64(v.data_ptr()),
                   np.int64(k.stride(0) // _VEC), np.int64(k.stride(1) // _VEC),
                   np.int64(v.stride(0) // _VEC), np.int64(v.stride(1) // _VEC),
                   k_tail, v_tail, np.int32(h), np.int32(t), np.int32(vecs), pos, device=k.device)
