"""Calibration: per-(layer, K/V, kv-head, channel) exponent windows, and the tables that store them.

Modules, bottom up: :mod:`.table` (:class:`CalibrationTable`, the file format, model checks),
:mod:`.fp8` (:class:`FP8Table`: FP8 scales and windows, :func:`calibrate_fp8`), :mod:`.shipped` (the tables shipped as package data, found by name), :mod:`.statistics` (window
choice and mode statistics, pure tensor functions), :mod:`.synthetic` (KV-like synthetic data),
:mod:`.collect` (running a model over text), :mod:`.fit` (:func:`calibrate` end to end) and
:mod:`.cli` (``gaac-calibrate``). Imports run one way: table/statistics <- collect <- fit <- cli.
"""
from .fit import calibrate, table_from_stats
from .fp8 import FP8Table, calibrate_fp8
from .shipped import find_table, shipped_tables
from .statistics import (
    MODE_NAMES,
    block_tags,
    choose_windows,
    escape_bytes,
    exponent_histogram,
    format_position_table,
    mode_statistics,
    window_coverage,
)
from .table import CalibrationTable, config_fingerprint, model_kv_shape, upgrade_table_file

__all__ = [
    "MODE_NAMES", "CalibrationTable", "FP8Table", "calibrate_fp8", "block_tags", "calibrate", "choose_windows", "config_fingerprint",
    "escape_bytes", "exponent_histogram", "find_table", "format_position_table", "mode_statistics",
    "model_kv_shape", "shipped_tables", "table_from_stats", "upgrade_table_file", "window_coverage",
]
