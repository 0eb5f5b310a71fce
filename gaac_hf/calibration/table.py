"""Calibration tables: per-(layer, K/V, kv-head, channel) exponent windows, stored with their metadata.

A table file is one safetensors file: tensors ``base8`` and ``base16`` (uint8 ``[L, 2, Hkv, D]``,
index 0 of dim 1 = keys, 1 = values) and a JSON header (``__metadata__["gaac"]``) holding the format
version, block geometry, the model fingerprint and how the table was made. :meth:`CalibrationTable.load`
refuses a file of another format version; :meth:`CalibrationTable.check_model` refuses a table made for
another model or shape.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..format import FORMAT_VERSION, BlockGeometry

#: safetensors metadata key of an FP8 table's header (:mod:`gaac_hf.calibration.fp8`); BF16 tables use ``gaac``
FP8_HEADER_KEY = "gaac_fp8"


# ---------------------------------------------------------------------------------------------
# model description
# ---------------------------------------------------------------------------------------------
def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _difference(key: str, have, want) -> str:
    """One field of a table/model mismatch; for lists only the count and the first differing entry."""
    if isinstance(have, list) and isinstance(want, list):
        if len(have) != len(want):
            return f"{key}: table {len(have)} entries vs model {len(want)}"
        diff = [i for i, (a, b) in enumerate(zip(have, want)) if a != b]
        return f"{key}: {len(diff)} of {len(have)} differ (first at {diff[0]}: table {have[diff[0]]!r} vs model {want[diff[0]]!r})"
    return f"{key}: table {have!r} vs model {want!r}"


def model_kv_shape(config) -> dict:
    """The facts about a transformers config that a table depends on."""
    c = _text_config(config)
    n_layers = c.num_hidden_layers
    n_heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    layer_types = list(getattr(c, "layer_types", None) or ["full_attention"] * n_layers)
    return {
        "model_type": getattr(c, "model_type", "unknown"),
        "num_layers": n_layers,
        "num_kv_heads": getattr(c, "num_key_value_heads", None) or n_heads,
        "num_attention_heads": n_heads,
        "head_dim": head_dim,
        "hidden_size": c.hidden_size,
        "layer_types": layer_types,
    }


def config_fingerprint(config) -> str:
    """Short hash of :func:`model_kv_shape` (plus rope settings, which move key exponents)."""
    c = _text_config(config)
    facts = model_kv_shape(config)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", None)}
    facts["rope"] = json.loads(json.dumps(rope, default=str, sort_keys=True))
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def check_fits(meta: dict, num_layers: int, head_dim: int, num_kv_heads: int, config, *, kv_heads: int | None = None,
               what: str = "calibration table", remedy: str = "make a table for this model with gaac-calibrate") -> None:
    """Raise ValueError unless a table (its ``meta`` header and tensor shape) was made for a model of this
    shape: layers, head_dim, layer types, model type, kv-heads, then the config fingerprint (rope).
    Shared by BF16 (:class:`CalibrationTable`) and FP8 (:class:`~gaac_hf.calibration.fp8.FP8Table`) tables."""
    want = model_kv_shape(config)
    have = dict(meta.get("kv_shape", {}))
    # the tensors' own shape wins over the header where both say it; each field is named once
    have |= {"num_layers": num_layers, "head_dim": head_dim}
    heads = kv_heads if kv_heads is not None else want["num_kv_heads"]
    problems = [_difference(key, have[key], want[key])
                for key in ("num_layers", "head_dim", "layer_types", "model_type")
                if key in have and have[key] != want[key]]
    if num_kv_heads != heads:
        problems.append(f"num_kv_heads: table {num_kv_heads} vs model {heads}")
    fp = meta.get("fingerprint")
    if not problems and fp is not None and kv_heads is None and fp != config_fingerprint(config):
        problems.append(f"config fingerprint: table {fp} vs model {config_fingerprint(config)} (rope or shape differ)")
    if problems:
        name = meta.get("model_name", "?")
        raise ValueError(f"{what} for {name!r} does not fit this model: " + "; ".join(problems) + f" ({remedy})")


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
@dataclass
class CalibrationTable:
    """Exponent windows for one model.

    base8, base16: uint8 ``[L, 2, Hkv, D]`` (L = all decoder layers; rows of layers that are not
        compressed, e.g. sliding-window layers, are present but unused).
    geometry: the block format the windows were measured for.
    meta: JSON-able provenance: ``model_name``, ``fingerprint``, ``kv_shape`` (see
        :func:`model_kv_shape`), ``text``, ``context``, ``tokens``, ``date``, statistics...
    """

    base8: torch.Tensor
    base16: torch.Tensor
    geometry: BlockGeometry
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("base8", "base16"):
            t = getattr(self, name)
            if t.dtype != torch.uint8 or t.dim() != 4 or t.shape[1] != 2:
                raise ValueError(f"{name} must be uint8 [layers, 2, kv_heads, head_dim], got {t.dtype} {tuple(t.shape)}")
            if t.shape[-1] != self.geometry.head_dim:
                raise ValueError(f"{name} head_dim {t.shape[-1]} != geometry.head_dim {self.geometry.head_dim}")
        if self.base8.shape != self.base16.shape:
            raise ValueError("base8 and base16 shapes differ")
        if int(self.base8.max()) > 248 or int(self.base16.max()) > 240:
            raise ValueError("window bases out of range (base8 <= 248, base16 <= 240)")

    @property
    def num_layers(self) -> int:
        return self.base8.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.base8.shape[2]

    def bases(self, layer_idx: int, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(base8, base16) uint8 ``[Hkv, D]`` for one layer's keys (kind=0) or values (kind=1)."""
        return self.base8[layer_idx, kind], self.base16[layer_idx, kind]

    def shard_heads(self, start: int, stop: int) -> "CalibrationTable":
        """The table restricted to kv-heads ``[start, stop)`` (tensor-parallel ranks)."""
        meta = dict(self.meta, kv_head_range=[start, stop])
        return CalibrationTable(self.base8[:, :, start:stop].clone(), self.base16[:, :, start:stop].clone(), self.geometry, meta)

    def to(self, device, non_blocking: bool = False) -> "CalibrationTable":
        """The same table on ``device``. Not validated again (this table's values were checked when it
        was built): reading them back would synchronize with a GPU. ``non_blocking`` copies a CPU
        table through pinned memory without blocking the host."""
        out = copy.copy(self)
        b8, b16 = self.base8, self.base16
        if non_blocking and b8.device.type == "cpu" and torch.cuda.is_available():
            b8, b16 = b8.pin_memory(), b16.pin_memory()
        out.base8, out.base16 = b8.to(device, non_blocking=non_blocking), b16.to(device, non_blocking=non_blocking)
        return out

    # -- compatibility ---------------------------------------------------------------------------
    def check_model(self, config, *, kv_heads: int | None = None) -> None:
        """Raise ValueError unless this table was made for a model of this shape.

        kv_heads: number of kv-heads this process holds (tensor parallel), default all of them.
        """
        check_fits(self.meta, self.num_layers, self.geometry.head_dim, self.num_kv_heads, config, kv_heads=kv_heads)

    # -- storage ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"format_version": FORMAT_VERSION, "geometry": self.geometry.to_dict(), "meta": self.meta}
        save_file(
            {"base8": self.base8.contiguous().cpu(), "base16": self.base16.contiguous().cpu()},
            str(path),
            metadata={"gaac": json.dumps(header, sort_keys=True)},
        )
        return path

    @classmethod
    def load(cls, path: str | Path, device="cpu") -> "CalibrationTable":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no calibration table at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                md = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for non-safetensors files
            raise ValueError(f"{path} is not a GAAC calibration table (safetensors): {e}") from e
        if FP8_HEADER_KEY in md:
            raise ValueError(f"{path} is a GAAC FP8 calibration table (windows of FP8 codes and scales), not a BF16 one: "
                             "load it with gaac_hf.calibration.FP8Table.load, or pass it to "
                             "GAACCache(..., kv_dtype='fp8_e4m3' | 'fp8_e5m2') as its header says")
        if "gaac" not in md or set(tensors) != {"base8", "base16"}:
            raise ValueError(f"{path} is not a GAAC calibration table (missing 'gaac' header or base tensors)")
        header = _parse_header(path, md["gaac"])
        if header.get("format_version") != FORMAT_VERSION:
            hint = f"; convert it with gaac_hf.calibration.upgrade_table_file({str(path)!r})" if header.get("format_version") == 1 else ""
            raise ValueError(
                f"{path} has GAAC format version {header.get('format_version')}; this gaac-hf reads {FORMAT_VERSION}{hint}"
            )
        try:
            geometry = BlockGeometry.from_dict(header["geometry"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: header field 'gaac.geometry' is missing or invalid ({e!r})") from None
        return cls(tensors["base8"].to(device), tensors["base16"].to(device), geometry, header.get("meta", {}))


def _parse_header(path, text) -> dict:
    """The JSON header of a table file (safetensors metadata field ``gaac``), or an error naming both."""
    if text is None:
        raise ValueError(f"{path}: no header field 'gaac' in the safetensors metadata: not a GAAC calibration table")
    try:
        header = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: header field 'gaac' is not valid JSON ({e.msg} at character {e.pos}); "
                         "the file is damaged: re-create it with gaac-calibrate") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header field 'gaac' must be a JSON object, got {type(header).__name__}")
    return header


def upgrade_table_file(path: str | Path, out: str | Path | None = None) -> Path:
    """Rewrite a format-version-1 table file as version 2 (in place unless ``out`` is given).

    Version 2 moved escape bytes out of fixed-capacity slots into an escape heap; the windows
    (``base8``/``base16``) mean the same in both versions and are kept bit for bit. The v1 escape
    capacity is recorded under ``meta["upgraded_from"]``. A v2 file is returned unchanged.
    """
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        header = _parse_header(path, (f.metadata() or {}).get("gaac"))
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    version = header.get("format_version")
    if version == FORMAT_VERSION:
        return path
    if version != 1:
        raise ValueError(f"{path}: cannot upgrade GAAC format version {version}")
    g = dict(header["geometry"])
    old_cap = g.pop("escape_capacity", None)
    geometry = BlockGeometry.from_dict(g | {"format_version": FORMAT_VERSION})
    meta = dict(header.get("meta", {}))
    meta.pop("escape_capacity", None)
    meta["upgraded_from"] = {"format_version": 1, "escape_capacity": old_cap}
    return CalibrationTable(tensors["base8"], tensors["base16"], geometry, meta).save(out or path)
