"""The arithmetic of the CPU tiled decode attention, in PyTorch (what ``gaac_cpu.cpp`` must match bit for bit).

:func:`tiled_attention_reference` is the executable definition: float32 everywhere; the context is cut
into tiles of ``block_size`` tokens (the cache's blocks, then the tail) and the tiles into splits of
``split_tiles``; per query vector, within a split, online softmax over the tiles in order; the splits
merged at the end in order. Every sum runs in one fixed order, each operation rounds once (no FMA),
and exp is :func:`exp_neg` (our own Cody-Waite reduction + degree-7 Taylor polynomial), so the C++
loops and these tensor ops give the same bits. The design follows FlashAttention's online softmax and
flash-decoding's split-and-merge; nothing is taken from their code.

It is also the path the cache takes on the CPU when the C++ library cannot be built (same bits,
slower: it needs the whole decoded K/V of the layer).
"""
from __future__ import annotations

import torch

F32 = torch.float32
# exact float32 values; gaac_cpu.cpp spells the same numbers as hex literals
LOG2E, LN2_HI, LN2_LO = float.fromhex("0x1.715476p+0"), float.fromhex("0x1.63p-1"), float.fromhex("-0x1.bd0106p-13")
_ONE = torch.tensor(1.0, dtype=F32)
#: 1/k! for k = 7..2 as float32 quotients (1.0f / 5040.0f in C++), then 1, 1
POLY = [float(_ONE / torch.tensor(float(f), dtype=F32)) for f in (5040, 720, 120, 24, 6)] + [0.5, 1.0, 1.0]


def exp_neg(x: torch.Tensor) -> torch.Tensor:
    """exp of float32 ``x <= 0`` (any shape): 0 below -87 and for NaN; within 2 ulp of exp elsewhere."""
    keep = x >= -87.0
    xc = torch.where(keep, x, 0.0)
    n = torch.round(xc * LOG2E)  # round half to even, like nearbyint
    r = xc - n * LN2_HI
    r = r - n * LN2_LO
    p = torch.full_like(r, POLY[0])
    for c in POLY[1:]:
        p = p * r
        p = p + c
    scale = ((n.to(torch.int32) + 127) << 23).view(F32)
    return torch.where(keep, p * scale, 0.0)


def _maximum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.maximum(a, b)  # NaN if either is NaN, like maxnan in the C++


def visibility(b: int, sq: int, length: int, mask: torch.Tensor | None, kv_start: torch.Tensor | None) -> torch.Tensor:
    """bool ``[B, Sq, S]``: which key positions each query row attends (mask ``[B, Sq, >= S]`` given, or
    bottom-right causal from ``kv_start``)."""
    pos = torch.arange(length)
    if mask is not None:
        return mask[:, :, :length].bool()
    lo = kv_start.to(torch.int64).view(b, 1, 1) if kv_start is not None else torch.zeros(b, 1, 1, dtype=torch.int64)
    hi = (length - sq + torch.arange(sq)).view(1, sq, 1)
    return (pos.view(1, 1, -1) >= lo) & (pos.view(1, 1, -1) <= hi)


def tiled_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                              block_size: int, split_tiles: int, mask: torch.Tensor | None = None,
                              kv_start: torch.Tensor | None = None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Attention with the CPU kernel's arithmetic.

    Args:
        query: BF16 ``[B, Hq, Sq, D]``. key, value: BF16 ``[B, H, S, D]`` (Hq a multiple of H; query head
            hq reads kv-head hq // (Hq / H)).
        mask: bool/uint8 ``[B, Sq, >= S]`` (True = attend) or None: bottom-right causal, positions
            ``< kv_start[b]`` masked.
        out_dtype: torch.float32 gives the values before the final rounding to BF16.
    Returns:
        ``[B, Sq, Hq, D]`` in ``out_dtype``.
    """
    b, hq, sq, d = query.shape
    h, s = key.shape[1], key.shape[2]
    rep, t = hq // h, block_size
    n = -(-s // t)  # tiles
    ns = -(-n // split_tiles) if n else 1
    pad = n * t - s
    qs = query.to(F32) * torch.tensor(scale, dtype=F32)  # [B, Hq, Sq, D]
    kf = key.to(F32).repeat_interleave(rep, 1)  # [B, Hq, S, D]
    vf = value.to(F32).repeat_interleave(rep, 1)
    kf = torch.nn.functional.pad(kf, (0, 0, 0, pad)).view(b, hq, 1, n, t, d)
    vf = torch.nn.functional.pad(vf, (0, 0, 0, pad)).view(b, hq, 1, n, t, d)
    vis = visibility(b, sq, s, mask, kv_start)
    vis = torch.nn.functional.pad(vis, (0, pad)).view(b, 1, sq, n, t)  # padded positions: not visible
    valid = torch.nn.functional.pad(torch.ones(s, dtype=torch.bool), (0, pad)).view(n, t)  # positions that exist
    # scores, summed over d in order: [B, Hq, Sq, n, T]
    sc = torch.zeros(b, hq, sq, n, t, dtype=F32)
    for j in range(d):
        sc = sc + qs[..., j, None, None] * kf[..., j]
    mt = torch.where(vis, sc, float("-inf")).amax(-1)  # [B, Hq, Sq, n]
    # online softmax within each split: tile k of split j is tile j * split_tiles + k
    m = torch.full((b, hq, sq, ns), float("-inf"))
    l = torch.zeros(b, hq, sq, ns)
    acc = torch.zeros(b, hq, sq, ns, d)
    for k in range(split_tiles):
        tiles = torch.arange(ns) * split_tiles + k
        exists = tiles < n
        ti = tiles.clamp(max=max(n - 1, 0))
        if not bool(exists.any()):
            break
        s_k, v_k, vis_k = sc[..., ti, :], vf[:, :, :, ti], vis[..., ti, :]  # [B,Hq,Sq,ns,T], [B,Hq,1,ns,T,D]
        m_new = _maximum(m, mt[..., ti])
        alpha = torch.where(m == float("-inf"), 0.0, exp_neg(m - m_new))
        p = torch.where(vis_k, exp_neg(s_k - m_new[..., None]), 0.0)
        ls = torch.zeros_like(l)
        pv = torch.zeros_like(acc)
        here = valid[ti]  # [ns, T]
        for u in range(t):
            ok = here[:, u]
            ls = torch.where(ok, ls + p[..., u], ls)
            pv = torch.where(ok[:, None], pv + p[..., u, None] * v_k[..., u, :], pv)
        e = exists.view(1, 1, 1, ns)
        l = torch.where(e, l * alpha + ls, l)
        acc = torch.where(e[..., None], acc * alpha[..., None] + pv, acc)
        m = torch.where(e, m_new, m)
    # merge the splits in order
    big = m.amax(-1, keepdim=True)
    w = torch.where(m == float("-inf"), 0.0, exp_neg(m - big))  # [B, Hq, Sq, ns]
    L = torch.zeros(b, hq, sq)
    A = torch.zeros(b, hq, sq, d)
    for j in range(ns):
        L = L + l[..., j] * w[..., j]
        A = A + acc[..., j, :] * w[..., j, None]
    out = torch.where((L == 0)[..., None], 0.0, A / L[..., None])
    return out.to(out_dtype).transpose(1, 2).contiguous()
