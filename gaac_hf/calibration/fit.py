"""Calibration end to end: run a model on text, choose the windows, record how they do.

:func:`calibrate` = :func:`~.collect.collect_kv_stats` (one pass of the model) followed by
:func:`table_from_stats` (windows from the histograms, mode and escape statistics, provenance).
"""
from __future__ import annotations

import datetime
import hashlib

import torch

from ..format import BlockGeometry
from .collect import collect_kv_stats, default_position_ranges, range_label
from .statistics import K, V, _shares, choose_windows, mode_statistics, window_coverage
from .table import CalibrationTable, config_fingerprint, model_kv_shape


def calibrate(
    model,
    tokenizer,
    text: str,
    *,
    context: int = 8192,
    block_size: int = 64,
    group_axis: str = "channel",
    max_tokens: int | None = None,
    text_name: str | None = None,
    model_name: str | None = None,
    stats_tokens: int | None = None,
    position_ranges: list[tuple[int, int]] | None = None,
    batch_size: int = 1,
    progress: bool = True,
    full_cache: bool = False,
) -> CalibrationTable:
    """Calibrate GAAC windows for ``model`` on ``text``.

    1. Run the model on chunks of ``context`` tokens (see :mod:`gaac_hf.calibration.collect`) and histogram the
       exponents of every (layer, K/V, kv-head, channel) over all chunks.
    2. :func:`choose_windows` picks each channel's 8- and 16-window.
    3. On the first ``stats_tokens`` tokens (default ``max(context, 32768)``) the group modes under
       those windows give the escape bytes per block and the expected compression ratio.
    4. ``meta`` records the model (name, fingerprint, kv_shape), the text (name, sha256, tokens),
       context, date, escape statistics, mode shares overall / per layer / per position range, and
       window coverage per position range (over all tokens).

    Keys are post-RoPE: calibrate with ``context`` at the deployment length. ``full_cache``: also
    calibrate sliding-window layers on every position (see :func:`gaac_hf.calibration.collect.run_chunks`).
    """
    head_dim = model_kv_shape(model.config)["head_dim"]
    BlockGeometry(block_size=block_size, head_dim=head_dim, group_axis=group_axis)  # validate early
    if position_ranges is None:
        position_ranges = default_position_ranges(context)
    stats = collect_kv_stats(
        model,
        tokenizer,
        text,
        context=context,
        max_tokens=max_tokens,
        position_ranges=position_ranges,
        keep_tokens=max(context, 32768) if stats_tokens is None else stats_tokens,
        block_size=block_size,
        batch_size=batch_size,
        progress=progress,
        full_cache=full_cache,
    )
    return table_from_stats(
        model.config,
        stats,
        block_size=block_size,
        group_axis=group_axis,
        model_name=model_name or getattr(model.config, "_name_or_path", None),
        text=text,
        text_name=text_name,
    )


def table_from_stats(
    config,
    stats,
    *,
    block_size: int = 64,
    group_axis: str = "channel",
    model_name: str | None = None,
    text: str | None = None,
    text_name: str | None = None,
) -> CalibrationTable:
    """Build a :class:`CalibrationTable` from :class:`gaac_hf.calibration.collect.KVStats` (steps 2-4 of
    :func:`calibrate`); one forward pass can serve several geometries (e.g. both group axes)."""
    shape = model_kv_shape(config)
    if not stats.exponents:
        raise ValueError("the stats keep no exponent sample (keep_tokens=0): cannot measure escape statistics")
    base8, base16 = choose_windows(stats.hist)
    geometry = BlockGeometry(block_size=block_size, head_dim=shape["head_dim"], group_axis=group_axis)
    probe = geometry
    ms = mode_statistics(stats.exponents, base8, base16, probe, stats.position_ranges, stats.layer_lengths)
    esc = ms["escape_bytes"]

    mc = ms["mode_counts"]
    coverage = window_coverage(stats.range_hist, base8, base16) if stats.range_hist is not None else []
    by_position = []
    for ri, r in enumerate(stats.position_ranges):
        rc = ms["range_counts"][ri]
        by_position.append(
            {
                "range": range_label(r),
                "start": r[0],
                "stop": r[1],
                "K": _shares(rc[K]),
                "V": _shares(rc[V]),
                "blocks": int(rc[K].sum()) // probe.groups,  # K blocks (as many V blocks)
                "window_coverage": coverage[ri] if coverage else None,
            }
        )
    escf = esc.double()
    text_meta = {"name": text_name or "<string>", "tokens_used": stats.tokens}
    if text is not None:
        text_meta |= {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "chars": len(text)}
    meta = {
        "model_name": model_name or shape["model_type"],
        "fingerprint": config_fingerprint(config),
        "kv_shape": shape,
        "text": text_meta,
        "context": stats.context,
        "chunks": stats.chunks,
        "tokens": stats.tokens,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "escapes": {
            "escape_limit": geometry.escape_limit,
            "blocks": int(esc.numel()),
            "escape_bytes_per_block": {
                "mean": round(escf.mean().item(), 3),
                "p50": int(torch.quantile(escf, 0.5).item()),
                "p99": int(torch.quantile(escf, 0.99).item()),
                "p999": int(torch.quantile(escf, 0.999).item()),
                "max": int(esc.max().item()),
            },
            "raw_fallback_share": round(float((esc > geometry.escape_limit).double().mean()), 6),
            # BF16 bytes / (slot + escape stream) over the sample, before per-block bookkeeping
            "ratio_estimate": round(2 * geometry.numel * esc.numel() / (geometry.slot_bytes * esc.numel() + float(escf.sum())), 5),
        },
        "stats_tokens": stats.kept_tokens,
        "mode_shares": {
            "K": _shares(mc[:, K].sum(0)),
            "V": _shares(mc[:, V].sum(0)),
            "per_layer": [{"layer": li, "K": _shares(mc[li, K]), "V": _shares(mc[li, V])} for li in range(mc.shape[0])],
            "by_position": by_position,
        },
    }
    return CalibrationTable(base8, base16, geometry, meta)
