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
            hint = f"; convert it with gaac_hf.calibration.upgrade_table_file({str(path)!r})" if header.get("format_version") == 1 else ""
            raise ValueError(
                f"{path} has GAAC format version {header.get('format_version')}; this gaac-hf reads {FORMAT_VERSION}{hint}"
            )
        geometry = BlockGeometry.from_dict(header["geometry"])
        return cls(tensors["base8"].to(device), tensors["base16"].to(device), geometry, header.get("meta", {}))


def upgrade_table_file(path: str | Path, out: str | Path | None = None) -> Path:
    """Rewrite a format-version-1 table file as version 2 (in place unless ``out`` is given).

    Version 2 moved escape bytes out of fixed-capacity slots into an escape heap; the windows
    (``base8``/``base16``) mean the same in both versions and are kept bit for bit. The v1 escape
    capacity is recorded under ``meta["upgraded_from"]``. A v2 file is returned unchanged.
    """
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        header = json.loads((f.metadata() or {})["gaac"])
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
    from .codec import group_modes

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
    from .format import ESCAPE_BYTES

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

    1. Run the model on chunks of ``context`` tokens (see :mod:`gaac_hf.collect`) and histogram the
       exponents of every (layer, K/V, kv-head, channel) over all chunks.
    2. :func:`choose_windows` picks each channel's 8- and 16-window.
    3. On the first ``stats_tokens`` tokens (default ``max(context, 32768)``) the group modes under
       those windows give the escape bytes per block and the expected compression ratio.
    4. ``meta`` records the model (name, fingerprint, kv_shape), the text (name, sha256, tokens),
       context, date, escape statistics, mode shares overall / per layer / per position range, and
       window coverage per position range (over all tokens).

    Keys are post-RoPE: calibrate with ``context`` at the deployment length. ``full_cache``: also
    calibrate sliding-window layers on every position (see :func:`gaac_hf.collect.run_chunks`).
    """
    from .collect import collect_kv_stats, default_position_ranges

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
    """Build a :class:`CalibrationTable` from :class:`gaac_hf.collect.KVStats` (steps 2-4 of
    :func:`calibrate`); one forward pass can serve several geometries (e.g. both group axes)."""
    import datetime

    from .collect import range_label

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
