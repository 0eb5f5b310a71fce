"""Exponent statistics: window choice, group modes and mode shares of sampled K/V.

Pure functions of tensors (no model, no table file): :mod:`.collect` gathers the samples and
:mod:`.fit` turns them into a :class:`~gaac_hf.calibration.table.CalibrationTable`.
"""
from __future__ import annotations

import torch

from ..codec import group_modes
from ..format import ESCAPE_BYTES, BlockGeometry

K, V = 0, 1


# ---------------------------------------------------------------------------------------------
# window choice
# ---------------------------------------------------------------------------------------------
def choose_windows(hist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the 8- and 16-wide exponent windows that cover the most values.

    Args:
        hist: int64 ``[..., 256]`` exponent histograms (one per channel).
    Returns:
        (base8, base16): uint8 ``[...]``, the first exponent of each window (base8 <= 248,
        base16 <= 240). Ties go to the lowest start. A channel never seen gets the window
        around exponent 127 (|x| near 1).
    """
    if hist.shape[-1] != 256:
        raise ValueError(f"hist must end in 256 exponent bins, got {tuple(hist.shape)}")
    h = hist.to(torch.int64)
    c = torch.cat([torch.zeros_like(h[..., :1]), h.cumsum(-1)], -1)  # [..., 257]
    out = []
    for w in (8, 16):
        cover = c[..., w:] - c[..., :-w]  # [..., 257 - w]: cover[s] = count in [s, s+w)
        best = cover.argmax(-1)  # first max
        empty = h.sum(-1) == 0
        best = torch.where(empty, torch.full_like(best, 127 - w // 2), best)
        out.append(best.to(torch.uint8))
    return out[0], out[1]


def exponent_histogram(x: torch.Tensor) -> torch.Tensor:
    """BF16 ``[..., S, D]`` -> int64 ``[..., D, 256]`` histogram of exponent fields per channel."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16, got {x.dtype}")
    e = ((x.view(torch.int16).to(torch.int32) >> 7) & 0xFF).transpose(-1, -2)  # [..., D, S]
    flat = e.reshape(-1, e.shape[-1])
    offs = torch.arange(flat.shape[0], device=x.device).unsqueeze(-1) * 256
    h = torch.bincount((flat + offs).reshape(-1), minlength=flat.shape[0] * 256)
    return h.reshape(*e.shape[:-1], 256)


# ---------------------------------------------------------------------------------------------
# group modes, escape statistics and mode statistics
# ---------------------------------------------------------------------------------------------
MODE_NAMES = ("3bit", "4bit", "raw")


def block_tags(exponent: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry: BlockGeometry) -> torch.Tensor:
    """Mode tag of every group of every full block, from exponent fields alone.

    Args:
        exponent: integer ``[..., S, D]`` exponent fields (S a multiple of the block size).
        base8, base16: uint8 ``[..., D]`` windows (broadcast over the leading dims of ``exponent``).
    Returns:
        int32 ``[..., S / block_size, groups_per_block]`` (the tags :func:`gaac_hf.codec.encode_blocks`
        writes for these values).
    """
    t, d = geometry.block_size, geometry.head_dim
    *lead, s, d2 = exponent.shape
    if d2 != d or s % t:
        raise ValueError(f"exponent shape {tuple(exponent.shape)} is not [..., k*{t}, {d}]")
    e = exponent.to(torch.int32).reshape(*lead, s // t, t, d)
    b8 = base8.to(torch.int32).unsqueeze(-2).unsqueeze(-2)  # [..., 1, 1, D]
    b16 = base16.to(torch.int32).unsqueeze(-2).unsqueeze(-2)
    if geometry.group_axis == "token":
        e = e.transpose(-1, -2)
        b8, b16 = b8.transpose(-1, -2), b16.transpose(-1, -2)
    tags = group_modes(e, b8.expand_as(e), b16.expand_as(e))  # [..., nb, rows, cols/8]
    return tags.reshape(*lead, s // t, -1)


def escape_bytes(tags: torch.Tensor) -> torch.Tensor:
    """Escape bytes per block: int32 ``[..., groups]`` tags -> int64 ``[...]``."""
    return torch.tensor(ESCAPE_BYTES, dtype=torch.int64, device=tags.device)[tags].sum(-1)


def _shares(counts: torch.Tensor) -> dict:
    tot = max(int(counts.sum()), 1)
    return {name: round(int(c) / tot, 6) for name, c in zip(MODE_NAMES, counts.tolist())}


def mode_statistics(
    exponents: list[torch.Tensor],
    base8: torch.Tensor,
    base16: torch.Tensor,
    geometry: BlockGeometry,
    position_ranges: list[tuple[int, int]],
    layer_lengths: list[int] | None = None,
) -> dict:
    """Group modes of sampled KV under given windows.

    Args:
        exponents: list of uint8 ``[L, 2, Hkv, S, D]`` exponent fields (one per sequence).
        base8, base16: uint8 ``[L, 2, Hkv, D]``.
        layer_lengths: tokens each layer really holds; layers holding fewer than S (sliding
            window) are left out.
    Returns:
        dict with ``escape_bytes`` (int64 tensor, one entry per block), ``mode_counts``
        (int64 ``[L, 2, 3]``) and ``range_counts`` (int64 ``[R, 2, 3]``; a block belongs to the
        range holding its first position).
    """
    L = base8.shape[0]
    t = geometry.block_size
    esc, mode_counts = [], torch.zeros(L, 2, 3, dtype=torch.int64)
    range_counts = torch.zeros(len(position_ranges), 2, 3, dtype=torch.int64)
    for ex in exponents:
        s = ex.shape[3]
        nb = s // t
        starts = torch.arange(nb) * t
        in_range = torch.stack([(starts >= a) & (starts < b) for a, b in position_ranges]) if position_ranges else None
        for li in range(L):
            if layer_lengths and layer_lengths[li] < s:
                continue
            tags = block_tags(ex[li, :, :, : nb * t], base8[li], base16[li], geometry)  # [2, H, nb, G]
            esc.append(escape_bytes(tags).flatten())
            onehot = torch.stack([(tags == m).sum(-1) for m in range(3)], -1)  # [2, H, nb, 3]
            per_block = onehot.sum(1)  # [2, nb, 3]
            mode_counts[li] += per_block.sum(1)
            if in_range is not None:
                range_counts += (in_range[:, None, :, None] * per_block[None]).sum(2)
    return {
        "escape_bytes": torch.cat(esc) if esc else torch.zeros(0, dtype=torch.int64),
        "mode_counts": mode_counts,
        "range_counts": range_counts,
    }


def window_coverage(hist: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor) -> dict:
    """Share of values inside their channel's 8-window and 16-window.

    hist: int64 ``[..., L, 2, H, D, 256]``; bases ``[L, 2, H, D]``. Returns per K/V shares summed
    over everything but the leading dims (a list if hist has a leading range dim).
    """
    e = torch.arange(256)
    b8 = base8.to(torch.int64).unsqueeze(-1)
    b16 = base16.to(torch.int64).unsqueeze(-1)
    in8 = (e >= b8) & (e < b8 + 8)
    in16 = (e >= b16) & (e < b16 + 16)

    def cov(h: torch.Tensor) -> dict:
        out = {}
        for kind, name in ((K, "K"), (V, "V")):
            hk = h[:, kind]
            tot = max(int(hk.sum()), 1)
            out[name] = {
                "in_8_window": round(int((hk * in8[:, kind]).sum()) / tot, 6),
                "in_16_window": round(int((hk * in16[:, kind]).sum()) / tot, 6),
                "values": int(hk.sum()),
            }
        return out

    return cov(hist) if hist.dim() == 5 else [cov(h) for h in hist]


def format_position_table(by_position: list[dict], title: str = "mode shares by position (groups)") -> str:
    """A plain-text table of K/V mode shares per position range."""
    lines = [title, f"{'positions':>10} | {'K 3b':>6} {'K 4b':>6} {'K raw':>6} | {'V 3b':>6} {'V 4b':>6} {'V raw':>6} | {'blocks':>7}"]
    for row in by_position:
        k, v = row["K"], row["V"]
        lines.append(
            f"{row['range']:>10} | {100 * k['3bit']:5.1f}% {100 * k['4bit']:5.1f}% {100 * k['raw']:5.2f}% | "
            f"{100 * v['3bit']:5.1f}% {100 * v['4bit']:5.1f}% {100 * v['raw']:5.2f}% | {row.get('blocks', 0):>7}"
        )
    return "\n".join(lines)
