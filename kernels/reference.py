"""The references the attention kernels must match.

:func:`attention_reference` is decode attention in fp64 on the CPU: every attention kernel (Triton
today, ``kernels/cuda`` next) is checked against it within BF16 tolerance, and against its own BF16
twin bit for bit. The codec kernels' reference is the executable spec in :mod:`gaac_hf.codec`.
"""
from __future__ import annotations

import math

import torch


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float | None = None,
    kv_start: list[int] | None = None,
) -> torch.Tensor:
    """fp64 decode attention. q ``[B, Hq, D]``, k/v ``[B, Hkv, S, D]`` -> fp64 ``[B, Hq, D]``."""
    B, HQ, D = q.shape
    HKV = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, HQ, D, dtype=torch.float64)
    for b in range(B):
        lo = 0 if kv_start is None else kv_start[b]
        kk = k[b, :, lo: seq_lens[b]].double().cpu().repeat_interleave(HQ // HKV, 0)  # [HQ, L, D]
        vv = v[b, :, lo: seq_lens[b]].double().cpu().repeat_interleave(HQ // HKV, 0)
        if kk.shape[1] == 0:
            continue
        s = torch.einsum("hd,hld->hl", q[b].double().cpu(), kk) * scale
        out[b] = torch.einsum("hl,hld->hd", torch.softmax(s, -1), vv)
    return out
