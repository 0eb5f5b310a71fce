"""Calibration tables: per-(layer, K/V, kv-head, channel) exponent windows, stored with their metadata.

A table file is one safetensors file: tensors ``base8`` and ``base16`` (uint8 ``[L, 2, Hkv, D]``,
index 0 of dim 1 = keys, 1 = values) and a JSON header (``__metadata__["gaac"]``) holding the format
version, block geometry, the model fingerprint and how the table was made. :meth:`CalibrationTable.load`
refuses a file of another format version; :meth:`CalibrationTable.check_model` refuses a table made for
another model or shape.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .format import FORMAT_VERSION, BlockGeometry

K, V = 0, 1


# ---------------------------------------------------------------------------------------------
# model description
# ---------------------------------------------------------------------------------------------
def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


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
# the table
# ---------------------------------------------------------------------------------------------
@dataclass
class CalibrationTable:
    """Exponent windows for one model.

    base8, base16: uint8 ``[L, 2, Hkv, D]`` (L = all decoder layers; rows of layers that are not
        compressed, e.g. sliding-window layers, are present but unused).
    geometry: the block format the windows (and escape capacity) were tuned for.
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

    def to(self, device) -> "CalibrationTable":
        return CalibrationTable(self.base8.to(device), self.base16.to(device), self.geometry, self.meta)

    # -- compatibility ---------------------------------------------------------------------------
    def check_model(self, config, *, kv_heads: int | None = None) -> None:
        """Raise ValueError unless this table was made for a model of this shape.

        kv_heads: number of kv-heads this process holds (tensor parallel), default all of them.
        """
        want = model_kv_shape(config)
        have = self.meta.get("kv_shape", {})
        problems = []
        for key in ("num_layers", "head_dim", "layer_types", "model_type"):
            if key in have and have[key] != want[key]:
                problems.append(f"{key}: table {have[key]!r} vs model {want[key]!r}")
        if self.num_layers != want["num_layers"]:
            problems.append(f"layers: table {self.num_layers} vs model {want['num_layers']}")
        if self.geometry.head_dim != want["head_dim"]:
            problems.append(f"head_dim: table {self.geometry.head_dim} vs model {want['head_dim']}")
        heads = kv_heads if kv_heads is not None else want["num_kv_heads"]
        if self.num_kv_heads != heads:
            problems.append(f"kv heads: table {self.num_kv_heads} vs model {heads}")
        fp = self.meta.get("fingerprint")
        if not problems and fp is not None and kv_heads is None and fp != config_fingerprint(config):
            problems.append(f"config fingerprint: table {fp} vs model {config_fingerprint(config)} (rope or shape differ)")
        if problems:
            name = self.meta.get("model_name", "?")
            raise ValueError(f"calibration table for {name!r} does not fit this model: " + "; ".join(problems))

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
        if "gaac" not in md or set(tensors) != {"base8", "base16"}:
            raise ValueError(f"{path} is not a GAAC calibration table (missing 'gaac' header or base tensors)")
        header = json.loads(md["gaac"])
        if header.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has GAAC format version {header.get('format_version')}; this gaac-hf reads {FORMAT_VERSION}"
            )
        geometry = BlockGeometry.from_dict(header["geometry"])
        return cls(tensors["base8"].to(device), tensors["base16"].to(device), geometry, header.get("meta", {}))
