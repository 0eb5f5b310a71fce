"""The escape heap: each encoded block's escape stream at its exact length (format v2).

The reference helpers that build, measure and append to a heap. ``kernels/triton/encode.py``'s
``append_escapes_triton`` must match :func:`append_escapes` byte for byte.
"""
from __future__ import annotations

import torch

from ..format import ESCAPE_BYTES, BlockGeometry
from .bits import _unpack


def pack_escapes(escapes: torch.Tensor, escape_len: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Escape rows -> an escape heap: the streams concatenated in block order.

    Args:
        escapes: uint8 ``[N, W]`` (row i's stream in its first ``escape_len[i]`` bytes).
        escape_len: int ``[N]``.
        start: heap offset of the first stream (appending to a heap that holds ``start`` bytes).
    Returns:
        (heap uint8 ``[sum(escape_len)]``, esc_start int64 ``[N]``: offset of each stream, from ``start``).
    """
    lens = escape_len.to(torch.int64)
    offs = torch.cumsum(lens, 0) - lens
    k = torch.arange(escapes.shape[1], device=escapes.device)
    keep = k < lens[:, None]
    return escapes[keep], offs + start


def escape_lengths(slots: torch.Tensor, geometry: BlockGeometry) -> torch.Tensor:
    """Escape-stream length of each slot, from its tag plane: uint8 ``[N, slot_bytes]`` -> int64 ``[N]``."""
    tags = _unpack(slots[:, geometry.tag_offset : geometry.tag_offset + geometry.tag_bytes], 2, geometry.groups)
    return torch.tensor(ESCAPE_BYTES, device=slots.device, dtype=torch.int64)[tags.long()].sum(-1)


def escape_source(escapes, n: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(heap, esc_start) from either form :func:`decode_blocks` accepts."""
    if isinstance(escapes, (tuple, list)):
        heap, start = escapes
        if heap.dtype != torch.uint8 or heap.dim() != 1:
            raise ValueError(f"escape heap must be uint8 [M], got {heap.dtype} {tuple(heap.shape)}")
        if start.dim() != 1 or start.shape[0] != n or start.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"esc_start must be int [{n}], got {start.dtype} {tuple(start.shape)}")
        return heap.to(dev), start.to(dev, torch.int64)
    if not isinstance(escapes, torch.Tensor) or escapes.dtype != torch.uint8 or escapes.dim() != 2 or escapes.shape[0] != n:
        raise ValueError(f"escapes must be uint8 [{n}, W] rows or a (heap, esc_start) pair, got {getattr(escapes, 'shape', type(escapes))}")
    w = escapes.shape[1]
    return escapes.reshape(-1).to(dev), torch.arange(n, device=dev, dtype=torch.int64) * w



def append_escapes(enc, heap: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Reference twin of ``kernels/triton/encode.append_escapes_triton``: the fitting blocks' streams are
    appended to ``heap`` in block order at ``used`` (advanced in place); returns int64 ``[N]`` starts.
    The last heap byte is a sink for the masked-out positions (no data-dependent shapes: no sync)."""
    lens = torch.where(enc.fits, enc.escape_len.to(torch.int64), 0)
    ends = torch.cumsum(lens, 0) + used.reshape(())
    start = ends - lens
    if lens.numel():
        k = torch.arange(enc.escapes.shape[1], device=heap.device)
        dest = torch.where(k < lens[:, None], start[:, None] + k, heap.numel() - 1)
        heap[dest.reshape(-1)] = enc.escapes.reshape(-1)
        used.copy_(ends[-1].reshape(used.shape))
    return start
