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


def merge_splits_reference(part_o: torch.Tensor, part_lse: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """The CUDA kernels' split merge (``kernels/cuda/include/gaac/attend.cuh`` ``finish``), in fp64.

    part_o ``[R, splits, D]``: each split's output normalised by its own softmax sum; part_lse ``[R, splits]``: its
    log2-sum-exp (``-inf`` for a split with no attended token). ``chunk`` > 0: two levels as the kernel runs them
    (chunks of ``chunk`` consecutive splits merged into a row and a log2-sum-exp each, then the chunk rows).
    Returns ``[R, D]``; rows whose splits are all empty are 0."""
    if chunk and part_o.shape[1] > chunk:
        rows, lses = [], []
        for c0 in range(0, part_o.shape[1], chunk):
            lse = part_lse[:, c0:c0 + chunk].double()
            ref = _finite_max(lse)
            wsum = torch.exp2(lse - ref[:, None]).sum(1)
            rows.append(merge_splits_reference(part_o[:, c0:c0 + chunk], lse))
            lses.append(torch.where(wsum > 0, ref + torch.log2(wsum), torch.full_like(wsum, -math.inf)))
        return merge_splits_reference(torch.stack(rows, 1), torch.stack(lses, 1))
    lse = part_lse.double()
    w = torch.exp2(lse - _finite_max(lse)[:, None])
    wsum = w.sum(1, keepdim=True)
    w = torch.where(wsum > 0, w / wsum.clamp_min(1e-300), torch.zeros_like(w))
    return torch.einsum("rs,rsd->rd", w, part_o.double())


def _finite_max(lse: torch.Tensor) -> torch.Tensor:
    """Row max with an all-``-inf`` row mapped to 0 (the kernel's ``ref``)."""
    mx = lse.max(1).values
    return torch.where(torch.isinf(mx) & (mx < 0), torch.zeros_like(mx), mx)
