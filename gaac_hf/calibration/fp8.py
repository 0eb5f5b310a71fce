"""FP8 calibration tables: the static FP8 scales and the exponent windows of the FP8 codes, for one model.

An FP8 KV cache converts BF16 K/V as ``(x.float() / scale).to(float8)``; GAAC then codes the FP8 codes'
exponent fields against per-channel windows (``docs/FORMAT_V3.md`` "FP8 tiles"). Both depend on the
scale, so one file carries both, for one FP8 format:

* ``scales`` float32 ``[L, 2]``: one static scale per (layer, K/V) tensor, ``amax(|x|) / max_finite`` over
  the calibration K/V (the convention of vLLM's ``k_scale`` / ``v_scale`` and of transformers'
  ``Fp8QuantizedLayer``, which takes it from the first prompt instead);
* ``base_n``, ``base_w`` uint8 ``[L, 2, Hkv, D]``: each channel's narrow (8 exponents) and wide (16)
  window start over the FP8 exponent field (E4M3: ``base_n <= 8``, ``base_w = 0``; E5M2: ``<= 24``, ``<= 16``).

File: one safetensors file with those three tensors and a JSON header under the metadata key
``gaac_fp8`` (not ``gaac``, so a BF16 reader never mistakes it for its own)::

    {"table": "gaac-fp8", "table_version": 1, "dtype": "fp8_e4m3", "geometry": {..., "format_version": 3},
     "scale": "per-tensor", "meta": {model_name, fingerprint, kv_shape, text, tokens, context, date, ...}}

:meth:`FP8Table.load` refuses a BF16 table, another table version, another FP8 format than asked for,
scales that are not finite and positive, and bases out of range, each with what to do instead.
"""
from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..codec.fp8 import check_bases, choose_windows_fp8, exponent_histogram_fp8, quantize_fp8
from ..format.fp8 import FP8_TYPES, TORCH_DTYPES, GeometryFP8
from .table import FP8_HEADER_KEY, check_fits, config_fingerprint, model_kv_shape

#: version of the FP8 table file (its header and tensors); a reader refuses any other
TABLE_VERSION = 1
TABLE_KIND = "gaac-fp8"
_TENSORS = {"scales", "base_n", "base_w"}


@dataclass
class FP8Table:
    """Static FP8 scales and FP8 exponent windows for one model and one FP8 format.

    scales: float32 ``[L, 2]`` (dim 1: 0 = keys, 1 = values), finite and > 0.
    base_n, base_w: uint8 ``[L, 2, Hkv, D]`` window starts (see the module docstring).
    geometry: the FP8 tile geometry (its ``dtype`` is the FP8 format, ``head_dim`` = D).
    meta: JSON-able provenance (model name, fingerprint, kv_shape, text, tokens, context, date).
    """

    scales: torch.Tensor
    base_n: torch.Tensor
    base_w: torch.Tensor
    geometry: GeometryFP8
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.geometry, GeometryFP8):
            raise TypeError(f"an FP8 table needs a GeometryFP8, got {type(self.geometry).__name__}")
        for name in ("base_n", "base_w"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 4 or t.shape[1] != 2 \
                    or t.shape[-1] != self.geometry.head_dim:
                raise ValueError(f"{name} must be uint8 [layers, 2, kv_heads, {self.geometry.head_dim}], got "
                                 f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
        if self.base_n.shape != self.base_w.shape:
            raise ValueError(f"base_n {tuple(self.base_n.shape)} and base_w {tuple(self.base_w.shape)} differ")
        check_bases(self.base_n, self.base_w, self.geometry)
        s = self.scales
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) != (self.num_layers, 2):
            raise ValueError(f"scales must be float32 [{self.num_layers}, 2] (one per layer and K/V: the per-tensor "
                             f"convention), got {getattr(s, 'dtype', type(s))} {tuple(getattr(s, 'shape', ()))}")
        if not bool((torch.isfinite(s) & (s > 0)).all()):
            raise ValueError("FP8 scales must be finite and > 0 (amax / max_finite, clamped away from 0)")

    @property
    def dtype(self) -> str:
        """The FP8 format: ``"fp8_e4m3"`` or ``"fp8_e5m2"``."""
        return self.geometry.dtype

    @property
    def num_layers(self) -> int:
        return self.base_n.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.base_n.shape[2]

    def scale(self, layer_idx: int, kind: int) -> torch.Tensor:
        """float32 0-d scale of one layer's keys (kind 0) or values (1)."""
        return self.scales[layer_idx, kind]

    def bases(self, layer_idx: int, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(base_n, base_w) uint8 ``[Hkv, D]`` of one layer's keys (kind 0) or values (1)."""
        return self.base_n[layer_idx, kind], self.base_w[layer_idx, kind]

    def check_model(self, config) -> None:
        """ValueError unless this table was made for a model of this shape (as BF16 tables check it)."""
        check_fits(self.meta, self.num_layers, self.geometry.head_dim, self.num_kv_heads, config,
                   what=f"FP8 ({self.dtype}) calibration table",
                   remedy=f"make one for this model with gaac-calibrate --kv-dtype {self.dtype}")

    def check_dtype(self, kv_dtype: str) -> None:
        """ValueError unless this table is for ``kv_dtype``: windows of E4M3 codes mean nothing for E5M2."""
        if kv_dtype != self.dtype:
            raise ValueError(f"this FP8 calibration table is for {self.dtype}, but kv_dtype={kv_dtype!r}: its scales and "
                             f"windows are those of {self.dtype} codes; calibrate with gaac-calibrate --kv-dtype {kv_dtype}")

    # -- storage ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"table": TABLE_KIND, "table_version": TABLE_VERSION, "dtype": self.dtype, "scale": "per-tensor",
                  "geometry": self.geometry.to_dict(), "meta": self.meta}
        tensors = {"scales": self.scales.contiguous().cpu(), "base_n": self.base_n.contiguous().cpu(),
                   "base_w": self.base_w.contiguous().cpu()}
        save_file(tensors, str(path), metadata={FP8_HEADER_KEY: json.dumps(header, sort_keys=True)})
        return path

    @classmethod
    def load(cls, path: str | Path, kv_dtype: str | None = None) -> "FP8Table":
        """Read a table file; ``kv_dtype`` (if given) must be the table's FP8 format."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no FP8 calibration table at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                md = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for other files
            raise ValueError(f"{path} is not a GAAC FP8 calibration table (safetensors): {e}") from e
        if FP8_HEADER_KEY not in md:
            if "gaac" in md:
                raise ValueError(f"{path} is a GAAC BF16 calibration table (windows of BF16 exponents, no FP8 scales): "
                                 "an FP8 cache needs its own table; make one with gaac-calibrate --kv-dtype "
                                 f"{kv_dtype or 'fp8_e4m3'} (or use the BF16 table with kv_dtype='bf16')")
            raise ValueError(f"{path} is not a GAAC FP8 calibration table (no {FP8_HEADER_KEY!r} header)")
        try:
            header = json.loads(md[FP8_HEADER_KEY])
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: header {FP8_HEADER_KEY!r} is not valid JSON ({e.msg}); the file is damaged: "
                             "re-create it with gaac-calibrate --kv-dtype ...") from None
        if not isinstance(header, dict) or header.get("table") != TABLE_KIND:
            raise ValueError(f"{path}: header {FP8_HEADER_KEY!r} does not describe a {TABLE_KIND} table")
        if header.get("table_version") != TABLE_VERSION:
            raise ValueError(f"{path} is an FP8 table of version {header.get('table_version')}; this gaac-hf reads "
                             f"version {TABLE_VERSION}: re-create it with this version's gaac-calibrate --kv-dtype")
        if header.get("scale") != "per-tensor":
            raise ValueError(f"{path}: FP8 scale granularity {header.get('scale')!r}; this gaac-hf uses per-tensor scales")
        if set(tensors) != _TENSORS:
            raise ValueError(f"{path}: an FP8 table holds tensors {sorted(_TENSORS)}, this file {sorted(tensors)}")
        try:
            geometry = GeometryFP8.from_dict(header["geometry"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: header field 'geometry' is missing or invalid ({e})") from None
        if header.get("dtype") != geometry.dtype:
            raise ValueError(f"{path}: header says dtype {header.get('dtype')!r} but its geometry {geometry.dtype!r}")
        table = cls(tensors["scales"], tensors["base_n"], tensors["base_w"], geometry, header.get("meta", {}))
        if kv_dtype is not None:
            table.check_dtype(kv_dtype)
        return table


def is_fp8_table(path: str | Path) -> bool:
    """Whether the safetensors file at ``path`` carries an FP8 table header (no validation)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return FP8_HEADER_KEY in (f.metadata() or {})
    except Exception:  # noqa: BLE001 - not a safetensors file: not an FP8 table
        return False


# ---------------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------------
def fp8_max(dtype: str) -> float:
    """Largest finite value of the FP8 format (E4M3 448, E5M2 57344)."""
    return torch.finfo(getattr(torch, TORCH_DTYPES[dtype])).max


#: K/V bytes of a calibration text up to which :func:`calibrate_fp8` keeps them between its two passes
KEEP_KV_BYTES = 256 << 20


def calibrate_fp8(model, tokenizer, text: str, *, dtype: str = "fp8_e4m3", context: int = 8192, block_size: int = 64,
                  max_tokens: int | None = None, text_name: str | None = None, model_name: str | None = None,
                  batch_size: int = 1, progress: bool = True) -> FP8Table:
    """Calibrate an FP8 table for ``model`` on ``text``: two passes over chunks of ``context`` tokens.

    1. Scales: per (layer, K/V) ``amax(|x|) / max_finite`` over every chunk, clamped to float32's tiny.
    2. Windows: the K/V converted with those scales (:func:`~gaac_hf.codec.fp8.quantize_fp8`, the cache's
       own conversion), per-channel exponent histograms of the codes, :func:`~gaac_hf.codec.fp8.choose_windows_fp8`.

    The windows depend on the scale, which depends on every chunk: the model runs twice, keeping nothing
    between chunks but ``[L, 2]`` maxima and ``[L, 2, Hkv, D, 2**E]`` histograms, unless the whole text's
    K/V take at most ``KEEP_KV_BYTES``: then the first pass's K/V are kept and the model runs once.
    """
    from .collect import run_chunks, split_chunks, tokenize

    if dtype not in FP8_TYPES:
        raise ValueError(f"FP8 calibration: dtype must be one of {sorted(FP8_TYPES)}, got {dtype!r}")
    shape = model_kv_shape(model.config)
    g = GeometryFP8(block_size=block_size, head_dim=shape["head_dim"], dtype=dtype)
    ids = tokenize(tokenizer, text, max_tokens)
    chunks = split_chunks(ids, context, block_size)
    n_layers, heads, d = shape["num_layers"], shape["num_kv_heads"], shape["head_dim"]
    amax = torch.zeros(n_layers, 2, dtype=torch.float32)
    # a calibration text whose K/V are small is kept from the first pass instead of running the model again
    # (the same K/V: one forward per chunk either way gives the same bits); a long one runs twice
    kept, kept_bytes = [], 0
    for _, keys, values in run_chunks(model, chunks, batch_size=batch_size, progress=progress, desc="fp8 scales"):
        for li in range(n_layers):
            for kind, x in ((0, keys[li]), (1, values[li])):
                amax[li, kind] = torch.maximum(amax[li, kind], x.abs().float().amax().cpu())
        if kept is not None:
            kept_bytes += sum(x.numel() * x.element_size() for x in (*keys, *values))
            if kept_bytes <= KEEP_KV_BYTES:
                kept.append((None, keys, values))
            else:
                kept = None
    scales = (amax / fp8_max(dtype)).clamp(min=torch.finfo(torch.float32).tiny)
    hist = torch.zeros(n_layers, 2, heads, d, 1 << g.exp_bits, dtype=torch.int64)
    second = kept if kept is not None else run_chunks(model, chunks, batch_size=batch_size, progress=progress,
                                                      desc="fp8 windows")
    for _, keys, values in second:
        for li in range(n_layers):
            for kind, x in ((0, keys[li]), (1, values[li])):
                hist[li, kind] += exponent_histogram_fp8(quantize_fp8(x, scales[li, kind], dtype, saturate=True), g).cpu()
    base_n, base_w = choose_windows_fp8(hist, g)
    meta = {
        "model_name": model_name or getattr(model.config, "_name_or_path", "unknown"),
        "fingerprint": config_fingerprint(model.config),
        "kv_shape": shape,
        "text": {"name": text_name or "<string>", "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]},
        "tokens": int(chunks.numel()), "context": context, "chunks": int(chunks.shape[0]),
        "date": datetime.date.today().isoformat(),
        "scale": "static per tensor: amax(|x|) / max_finite over the calibration K/V",
    }
    return FP8Table(scales, base_n, base_w, g, meta)


__all__ = ["FP8Table", "TABLE_VERSION", "calibrate_fp8", "fp8_max", "is_fp8_table"]
