"""Per-block checksums: what a stored block's bytes must sum to, and the structural checks of a heap.

:func:`block_sums` is a weighted byte sum in int64: byte ``i`` of a block's bytes (its slot, then its
escape stream; or its raw BF16 row) counts ``(byte + 1) * w[i]`` with fixed odd weights ``w < 2**31``.
Any single flipped bit changes the sum (by ``+-2**k * w[i]``, never 0), a moved or truncated stream
almost surely does; no overflow (a block has < 2**14 bytes). Plain torch on any device, no host sync:
the cache computes it at encode time (``GAACCache(checksums=True)``) and ``cache.verify()`` compares.
"""
from __future__ import annotations

import torch

from ..format import BlockGeometry
from .escapes import escape_lengths

_WEIGHTS: dict = {}


def _weights(n: int, offset: int, device) -> torch.Tensor:
    """int64 ``[n]`` odd weights for byte positions ``offset .. offset + n`` (a fixed sequence)."""
    key = (n, offset, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        i = torch.arange(offset, offset + n, dtype=torch.int64, device=device)  # made there: no copy, no sync
        w = _WEIGHTS[key] = ((i * 2654435761 + 12345) % 2147483647) | 1
    return w


def byte_sums(rows: torch.Tensor, offset: int = 0, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 ``[N, L]`` -> int64 ``[N]``: the weighted sum of each row's first ``lengths[i]`` bytes (all
    ``L`` without ``lengths``), byte positions counted from ``offset``."""
    w = _weights(rows.shape[1], offset, rows.device)
    x = rows.to(torch.int64) + 1
    if lengths is not None:
        x = x * (torch.arange(rows.shape[1], device=rows.device) < lengths.reshape(-1, 1))
    return (x * w).sum(-1)


def block_sums(slots: torch.Tensor, escapes: torch.Tensor, escape_len: torch.Tensor) -> torch.Tensor:
    """Checksums of compressed blocks: slot uint8 ``[N, slot_bytes]`` + stream rows uint8 ``[N, W]``
    (row i's first ``escape_len[i]`` bytes) -> int64 ``[N]``."""
    return byte_sums(slots) + byte_sums(escapes, slots.shape[1], escape_len)


def raw_sums(raw: torch.Tensor) -> torch.Tensor:
    """Checksums of raw BF16 blocks ``[N, T, D]`` -> int64 ``[N]``."""
    return byte_sums(raw.reshape(raw.shape[0], raw.shape[1] * raw.shape[2]).view(torch.uint8))


def heap_rows(heap: torch.Tensor, esc_start: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width`` heap bytes from each ``esc_start`` (0 past the heap's end): uint8 ``[N, width]``."""
    idx = esc_start.reshape(-1, 1) + torch.arange(width, device=heap.device)
    ok = (idx >= 0) & (idx < heap.numel())
    return torch.where(ok, heap[idx.clamp(0, max(heap.numel() - 1, 0))], 0).to(torch.uint8)


def next_starts(esc_start: torch.Tensor, heap_used) -> torch.Tensor:
    """Where the stream after each slot row's starts (the heap bytes in use after the last row):
    streams are appended in slot order at their exact lengths, a raw fallback's unused row adding none."""
    used = torch.as_tensor(heap_used, device=esc_start.device, dtype=torch.int64).reshape(1)
    return torch.cat([esc_start[1:], used])


def structure_problems(slots: torch.Tensor, esc_start: torch.Tensor, ends: torch.Tensor,
                       geometry: BlockGeometry) -> list[str]:
    """Structural checks of stored blocks (slot rows ``[N, slot_bytes]``, their ``esc_start [N]`` and
    the start of the next row's stream ``ends [N]``, see :func:`next_starts`): no reserved tag, and
    each stream exactly as long as its tag plane says (so within the heap in use and at most the
    escape limit). Returns what is wrong, empty if nothing (one host sync)."""
    from ..format import ESCAPE_BYTES, MODE_4BIT, MODE_RAW, MODE_RESERVED
    from .bits import _unpack

    if slots.shape[0] == 0:
        return []
    g = geometry
    tags = _unpack(slots[:, g.tag_offset : g.tag_offset + g.tag_bytes], 2, g.groups)
    counts = torch.stack([(tags == m).sum(-1) for m in (MODE_4BIT, MODE_RAW, MODE_RESERVED)])  # [3, N]
    lens = counts[0] * ESCAPE_BYTES[MODE_4BIT] + counts[1] * ESCAPE_BYTES[MODE_RAW]
    reserved = counts[2] > 0
    wrong = (esc_start < 0) | (esc_start + lens != ends) | (lens > g.escape_limit)
    flags = torch.stack([reserved.any(), wrong.any()]).tolist()  # the one sync
    out = []
    if flags[0]:
        out.append(f"reserved mode tag 3 in stored blocks {reserved.nonzero().flatten()[:8].tolist()}")
    if flags[1]:
        out.append(f"impossible escape-stream length or offset in stored blocks {wrong.nonzero().flatten()[:8].tolist()}")
    return out
