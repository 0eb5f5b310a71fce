"""The split merge's algebra (``kernels.reference.merge_splits_reference``, what ``attend.cuh`` ``finish`` runs):
one level and two levels (any chunk, uneven last chunk, empty splits and empty chunks) give softmax attention over
the whole context, in fp64. The CUDA code itself is checked on the GPU (``tests/test_v4_gpu.py``: fused == twin at
forced chunks, and the fp64 reference)."""
from __future__ import annotations

import math

import pytest
import torch

from gaac_hf.kernels.reference import merge_splits_reference


def _partials(scores, values, bounds):
    """Split [lo, hi) partials the way a CTA writes them: o normalised by its own sum, log2-sum-exp."""
    po, pl = [], []
    for lo, hi in bounds:
        s = scores[:, lo:hi] * (1 / math.log(2))  # base-2 logits, as the kernels scale them
        if hi == lo:
            po.append(torch.zeros(scores.shape[0], values.shape[-1], dtype=torch.float64))
            pl.append(torch.full((scores.shape[0],), -math.inf, dtype=torch.float64))
            continue
        m = s.max(1).values
        p = torch.exp2(s - m[:, None])
        l = p.sum(1)
        po.append(torch.einsum("rl,ld->rd", p, values[lo:hi]) / l[:, None])
        pl.append(m + torch.log2(l))
    return torch.stack(po, 1), torch.stack(pl, 1)


@pytest.mark.parametrize("splits,chunk", [(1, 0), (7, 0), (11, 4), (17, 16), (128, 16), (40, 3), (9, 2)])
def test_merge_levels_equal_softmax_attention(splits, chunk):
    g = torch.Generator().manual_seed(splits * 31 + chunk)
    L, R, D = 997, 4, 32
    scores = torch.randn(R, L, generator=g, dtype=torch.float64) * 4
    values = torch.randn(L, D, generator=g, dtype=torch.float64)
    edges = sorted(torch.randint(0, L, (splits - 1,), generator=g).tolist())
    bounds = list(zip([0] + edges, edges + [L]))  # some splits may be empty
    po, pl = _partials(scores, values, bounds)
    want = torch.softmax(scores, 1) @ values
    got = merge_splits_reference(po, pl, chunk)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_empty_chunks_and_empty_rows():
    """A chunk whose splits attend nothing (left padding) weighs 0; a row with nothing at all is 0, not NaN."""
    L, D = 64, 8
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, L, generator=g, dtype=torch.float64)
    values = torch.randn(L, D, generator=g, dtype=torch.float64)
    bounds = [(0, 0)] * 5 + [(0, 30), (30, 64)]  # chunks of 2: the first two chunks are empty
    po, pl = _partials(scores, values, bounds)
    assert torch.allclose(merge_splits_reference(po, pl, 2), torch.softmax(scores, 1) @ values, rtol=1e-12)
    empty = torch.full((1, 6), -math.inf, dtype=torch.float64)
    out = merge_splits_reference(torch.randn(1, 6, D, dtype=torch.float64), empty, 4)
    assert torch.equal(out, torch.zeros(1, D, dtype=torch.float64))


def test_a_wrong_chunk_weight_is_caught():
    """Mutation check: dropping the chunk's log2-sum-exp (weighting chunks equally) must fail the comparison."""
    g = torch.Generator().manual_seed(5)
    L, D = 300, 16
    scores = torch.randn(2, L, generator=g, dtype=torch.float64) * 3
    values = torch.randn(L, D, generator=g, dtype=torch.float64)
    bounds = [(i * 30, (i + 1) * 30) for i in range(10)]
    po, pl = _partials(scores, values, bounds)
    chunks = [merge_splits_reference(po[:, c:c + 4], pl[:, c:c + 4]) for c in range(0, 10, 4)]
    wrong = torch.stack(chunks, 1).mean(1)
    assert not torch.allclose(wrong, torch.softmax(scores, 1) @ values, rtol=1e-6)
