"""Calibration tables for format v3: the v2 windows carry over unchanged.

A v3 table file has the same tensors as v1/v2 (``base8``, ``base16``: uint8 ``[L, 2, Hkv, D]``) and a
``gaac`` JSON header with ``format_version: 3`` and a :class:`~gaac_hf.v3.format.GeometryV3`.
v1 and v2 files (groups along channels) are upgraded on load: base8/base16 mean exactly the same in
v3 (the first exponent of each channel's 8- and 16-window), only the block layout changed. Token-axis
tables are refused (v3 groups along channels only); so is any other version.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .format import FORMAT_VERSION, GeometryV3


@dataclass
class TableV3:
    base8: torch.Tensor  # uint8 [L, 2, Hkv, D]
    base16: torch.Tensor
    geometry: GeometryV3
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t in (self.base8, self.base16):
            if t.dtype != torch.uint8 or t.dim() != 4 or t.shape[1] != 2 or t.shape[-1] != self.geometry.head_dim:
                raise ValueError(f"bases must be uint8 [layers, 2, kv_heads, {self.geometry.head_dim}], got {t.dtype} {tuple(t.shape)}")
        if int(self.base8.max()) > 248 or int(self.base16.max()) > 240:
            raise ValueError("window bases out of range (base8 <= 248, base16 <= 240)")

    def bases(self, layer_idx: int, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base8[layer_idx, kind], self.base16[layer_idx, kind]

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        header = {"format_version": FORMAT_VERSION, "geometry": self.geometry.to_dict(), "meta": self.meta}
        save_file({"base8": self.base8.contiguous().cpu(), "base16": self.base16.contiguous().cpu()}, str(path),
                  metadata={"gaac": json.dumps(header, sort_keys=True)})
        return path


def load_table_v3(path: str | Path, *, upgrade: bool = True) -> TableV3:
    """Load a table for format v3; v1/v2 channel-axis tables are upgraded in memory (``upgrade=False``
    refuses them instead), recording ``meta["upgraded_from"]``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no calibration table at {path}")
    with safe_open(str(path), framework="pt") as f:
        md = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "gaac" not in md or set(tensors) != {"base8", "base16"}:
        raise ValueError(f"{path} is not a GAAC calibration table")
    header = json.loads(md["gaac"])
    v, geo = header.get("format_version"), dict(header.get("geometry", {}))
    meta = dict(header.get("meta", {}))
    if v in (1, 2):
        if not upgrade:
            raise ValueError(f"{path} is a GAAC format v{v} table; load it with upgrade=True (its windows carry over to v3)")
        if geo.get("group_axis", "channel") != "channel":
            raise ValueError(f"{path}: format v3 groups along channels; this v{v} table was calibrated along {geo.get('group_axis')!r}")
        meta["upgraded_from"] = {"format_version": v, "geometry": geo}
        geo = {"block_size": geo["block_size"], "head_dim": geo["head_dim"], "format_version": FORMAT_VERSION}
    elif v != FORMAT_VERSION:
        raise ValueError(f"{path} has GAAC format version {v}; the v3 reader reads {FORMAT_VERSION} (and upgrades 1 and 2)")
    return TableV3(tensors["base8"], tensors["base16"], GeometryV3.from_dict(geo), meta)
