"""Held-out GAAC compression report for a real model.

Calibrates on WikiText-2 v1 validation text, runs the model over held-out WikiText-2 raw test text,
encodes every full block of every layer's K and V with the reference codec
(:func:`gaac_hf.codec.encode_tensor`), decodes it and compares the int16 bit patterns, and writes
``eval/results/compression_<model>.json`` and ``.png``.

    python eval/compression_report.py --model smollm2

Definitions (also written into the JSON under ``definitions``):

* ``ratio`` (codec only) = BF16 bytes of all full blocks / codec bytes, where codec bytes of a block
  are its planes (sign+mantissa, 2+1 code bit-planes, mode tags) plus the escape bytes it really uses,
  and a block stored raw (escape stream longer than ``escape_limit``) counts 2 bytes per value.
* ``ratio_with_overhead`` = BF16 bytes / stored bytes in format v2, where a compressed block takes its
  slot (planes with 16-byte alignment, ``slot_bytes``), its escape stream at its exact length in the
  escape heap and an 8-byte ``esc_start``; a raw-fallback block 2 bytes per value; every block a 4-byte
  block-table entry; and the calibration table (base8 + base16, one byte each per layer, K/V, kv-head,
  channel) is counted once per evaluated sequence of ``context`` tokens (the same bytes as
  ``EncodedTensor.nbytes(with_overhead=True)`` plus the table).
* ``bits_per_element`` = 8 x stored bytes (with overhead) / values.
* ``raw_group_share`` = groups in raw mode / all groups, K and V together.
* ``bit_exact`` = every decoded block has the same 16 bits as the model's K/V.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
def _data_file(rel: str) -> Path:
    """A shared data file in gaac_hf.data's order ($GAAC_HF_DATA, ../shared/data); the first place if none has it."""
    from gaac_hf.data import DataNotFound, data_dirs, data_file

    try:
        return data_file(rel)
    except DataNotFound:
        return data_dirs()[0] / rel


CALIB_TEXT = _data_file("wikitext-2-v1/valid.txt")
EVAL_TEXT = _data_file("wikitext-2-raw-v1/wiki.test.raw")
SHIPPED = {"smollm2": REPO / "calibration_data" / "smollm2-135m.safetensors"}

DEFINITIONS = {
    "ratio": "BF16 bytes of all full blocks / codec bytes (planes + escape bytes actually used; raw-fallback blocks at 2 B/value)",
    "ratio_with_overhead": "BF16 bytes / stored bytes (format v2: compressed block = slot_bytes + exact escape stream + 8-byte "
    "esc_start; raw-fallback block = 2 B/value; 4-byte block-table entry per block; calibration table counted once per "
    "evaluated sequence)",
    "bits_per_element": "8 * stored bytes with overhead / values",
    "bits_per_element_codec": "8 * codec bytes / values",
    "raw_group_share": "groups coded raw (8-bit exponent) / all groups, K and V together",
    "raw_block_share": "blocks whose escape stream exceeds escape_limit = raw_bytes - slot_bytes (stored raw) / all blocks",
    "bit_exact": "decode(encode(x)) has the same int16 bits as x for every block",
}


class Tally:
    """Byte and mode counts for one group axis, split by (layer, K/V) and (position range, K/V)."""

    def __init__(self, layers: int, ranges: list[tuple[int, int]], geometry):
        self.g = geometry
        self.ranges = ranges
        n_r = len(ranges)
        # columns: values, codec bytes, stored bytes (no table), blocks, raw blocks
        self.layer = torch.zeros(layers, 2, 5, dtype=torch.float64)
        self.layer_modes = torch.zeros(layers, 2, 3, dtype=torch.int64)
        self.range = torch.zeros(n_r, 2, 5, dtype=torch.float64)
        self.range_modes = torch.zeros(n_r, 2, 3, dtype=torch.int64)
        self.esc_hist = torch.zeros(2, geometry.max_escape_bytes + 1, dtype=torch.int64)
        self.bit_exact = True
        self.sequences = 0

    def add(self, li: int, kind: int, enc, exact: bool, first_pos: int = 0) -> None:
        g = self.g
        fits = enc.blocks.fits
        esc = enc.blocks.escape_len.to(torch.int64)
        fixed = g.sm_bytes + g.lo2_bytes + g.hi1_bytes + g.tag_bytes
        codec = torch.where(fits, fixed + esc, torch.full_like(esc, g.raw_bytes)).double()
        # format v2: slot + exact escape stream + 8-byte esc_start, or the raw block; 4-byte table entry each
        stored = torch.where(fits, g.slot_bytes + esc + 8, torch.full_like(esc, g.raw_bytes)).double() + 4
        tags = enc.blocks.tags.reshape(esc.shape[0], -1)
        modes = torch.stack([(tags == m).sum(-1) for m in range(3)], -1)  # [N, 3]
        n = esc.shape[0]
        cols = torch.stack([torch.full((n,), float(g.numel), dtype=torch.float64), codec, stored, torch.ones(n, dtype=torch.float64), (~fits).double()], -1)
        self.layer[li, kind] += cols.sum(0)
        self.layer_modes[li, kind] += modes.sum(0)
        self.esc_hist[kind] += torch.bincount(esc, minlength=self.esc_hist.shape[1])
        nb = n // enc.heads
        pos = first_pos + (torch.arange(n) % nb) * g.block_size
        for ri, (a, b) in enumerate(self.ranges):
            m = (pos >= a) & (pos < b)
            self.range[ri, kind] += cols[m].sum(0)
            self.range_modes[ri, kind] += modes[m].sum(0)
        self.bit_exact &= exact


def _shares(c: torch.Tensor) -> dict:
    tot = max(int(c.sum()), 1)
    return {"3bit": round(int(c[0]) / tot, 6), "4bit": round(int(c[1]) / tot, 6), "raw": round(int(c[2]) / tot, 6)}


def _ratio(cols: torch.Tensor, col: int, extra: float = 0.0) -> float:
    return round(float(cols[..., 0].sum() * 2 / (cols[..., col].sum() + extra)), 5) if cols[..., 0].sum() > 0 else None


def summarize(t: Tally, table_bytes: int, layer_types: list[str]) -> dict:
    g = t.g
    table_total = table_bytes * t.sequences
    values = float(t.layer[..., 0].sum())
    stored = float(t.layer[..., 2].sum()) + table_total
    codec = float(t.layer[..., 1].sum())
    full = [i for i, lt in enumerate(layer_types) if lt == "full_attention"]
    out = {
        "geometry": g.to_dict() | {"slot_bytes": g.slot_bytes, "raw_bytes": g.raw_bytes, "escape_limit": g.escape_limit},
        "ratio": _ratio(t.layer, 1),
        "ratio_with_overhead": _ratio(t.layer, 2, table_total),
        "bits_per_element": round(8 * stored / values, 4),
        "bits_per_element_codec": round(8 * codec / values, 4),
        "raw_group_share": round(int(t.layer_modes[..., 2].sum()) / max(int(t.layer_modes.sum()), 1), 6),
        "raw_block_share": round(float(t.layer[..., 4].sum() / t.layer[..., 3].sum()), 6),
        "ratio_K": _ratio(t.layer[:, 0], 1),
        "ratio_V": _ratio(t.layer[:, 1], 1),
        "mode_shares": {"K": _shares(t.layer_modes[:, 0].sum(0)), "V": _shares(t.layer_modes[:, 1].sum(0))},
        "blocks": int(t.layer[..., 3].sum()),
        "values": int(values),
        "bit_exact": t.bit_exact,
    }
    if len(full) < len(layer_types):
        out["ratio_full_attention_layers"] = _ratio(t.layer[full], 1)
    esc = t.esc_hist.sum(0)
    mean_esc = float((esc * torch.arange(esc.numel())).sum() / max(int(esc.sum()), 1))
    out["escape_bytes_per_block"] = {"mean": round(mean_esc, 3), "escape_limit": g.escape_limit, "max": int(esc.nonzero().max())}
    return out


def details(t: Tally, layer_types: list[str]) -> dict:
    from gaac_hf.calibration.collect import range_label

    per_layer = []
    for li in range(t.layer.shape[0]):
        if t.layer[li, :, 3].sum() == 0:
            continue
        per_layer.append(
            {
                "layer": li,
                "type": layer_types[li],
                "K": {"ratio": _ratio(t.layer[li, 0], 1), "raw_blocks": int(t.layer[li, 0, 4])} | _shares(t.layer_modes[li, 0]),
                "V": {"ratio": _ratio(t.layer[li, 1], 1), "raw_blocks": int(t.layer[li, 1, 4])} | _shares(t.layer_modes[li, 1]),
            }
        )
    by_pos = []
    for ri, r in enumerate(t.ranges):
        row = {"range": range_label(r), "start": r[0], "stop": r[1], "blocks": int(t.range[ri, 0, 3])}
        for kind, name in ((0, "K"), (1, "V")):
            row[name] = {"ratio": _ratio(t.range[ri, kind], 1), "raw_blocks": int(t.range[ri, kind, 4])} | _shares(t.range_modes[ri, kind])
        by_pos.append(row)
    return {"per_layer": per_layer, "by_position": by_pos}


def plot(path: Path, title: str, primary: Tally, det: dict, comparison: dict) -> None:
    plt = harness.pyplot()

    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))
    layers = [r["layer"] for r in det["per_layer"]]
    for name, c in (("K", "tab:blue"), ("V", "tab:orange")):
        ax[0, 0].plot(layers, [r[name]["ratio"] for r in det["per_layer"]], "o-", color=c, label=name, ms=3)
    ax[0, 0].axhline(1.40, color="gray", ls="--", lw=0.8, label="1.40x")
    ax[0, 0].set(xlabel="layer", ylabel="codec ratio", title="ratio per layer (held out)")
    ax[0, 0].legend()
    w = 0.4
    for off, name in ((-w / 2, "K"), (w / 2, "V")):
        x = [lv + off for lv in layers]
        s3 = [r[name]["3bit"] for r in det["per_layer"]]
        s4 = [r[name]["4bit"] for r in det["per_layer"]]
        sr = [r[name]["raw"] for r in det["per_layer"]]
        ax[0, 1].bar(x, s4, w, bottom=s3, color="tab:orange" if name == "K" else "gold", label=f"{name} 4-bit")
        ax[0, 1].bar(x, sr, w, bottom=[a + b for a, b in zip(s3, s4)], color="red", label=f"{name} raw" if name == "K" else None)
    ax[0, 1].set(xlabel="layer (left bar K, right bar V)", ylabel="share of groups", title="4-bit and raw groups per layer", ylim=(0.0, None))
    ax[0, 1].set_ylim(min(min(r["K"]["3bit"], r["V"]["3bit"]) for r in det["per_layer"]) - 0.02, 1.0)
    ax[0, 1].legend(fontsize=7)
    labels = [r["range"] for r in det["by_position"]]
    for name, c in (("K", "tab:blue"), ("V", "tab:orange")):
        ax[1, 0].plot(labels, [r[name]["ratio"] for r in det["by_position"]], "o-", color=c, label=f"{name} ratio")
    ax2 = ax[1, 0].twinx()
    ax2.plot(labels, [100 * r["K"]["raw"] for r in det["by_position"]], "s--", color="tab:red", label="K raw groups %")
    ax2.set_ylabel("raw K groups (%)")
    ax[1, 0].set(xlabel="token positions", ylabel="codec ratio", title="by position (RoPE drift)")
    ax[1, 0].legend(loc="lower left")
    ax2.legend(loc="lower right")
    esc = primary.esc_hist
    top = int(esc.sum(0).nonzero().max()) + 1
    for kind, name, c in ((0, "K", "tab:blue"), (1, "V", "tab:orange")):
        ax[1, 1].plot(range(top), esc[kind, :top].tolist(), color=c, label=name)
    tot = esc.sum(0)
    mean = float((tot * torch.arange(tot.numel())).sum() / max(int(tot.sum()), 1))
    ax[1, 1].axvline(mean, color="k", ls="--", label=f"mean {mean:.1f} B")
    lim = primary.g.escape_limit
    if lim < top:
        ax[1, 1].axvline(lim, color="red", ls=":", label=f"escape_limit {lim} B (raw beyond)")
    ax[1, 1].set(xlabel="escape bytes per block", ylabel="blocks",
                 title=f"escape bytes per block (exact length; raw beyond {lim} B)")
    ax[1, 1].legend()
    comp = ", ".join(f"{a}: {v['ratio']:.4f}x" for a, v in comparison.items())
    fig.suptitle(f"{title}\ngroup axis: {comp}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="'smollm2', 'gemma3' (optional) or a local transformers folder")
    ap.add_argument("--calib-text", default=str(CALIB_TEXT))
    ap.add_argument("--eval-text", default=str(EVAL_TEXT))
    ap.add_argument("--context", type=int, default=8192, help="tokens per sequence (calibration and evaluation)")
    ap.add_argument("--calib-context", type=int, default=None, help="calibration context if not --context (to measure RoPE drift)")
    ap.add_argument("--calib-max-tokens", type=int, default=32768)
    ap.add_argument("--eval-max-tokens", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--axes", default="channel,token", help="group axes to measure; the first is the primary (kernels: channel)")
    ap.add_argument("--table", default=None, help="use this calibration table for the primary axis ('shipped' = calibration_data/)")
    ap.add_argument("--full-cache", action="store_true", help="measure sliding-window layers on all positions too")
    ap.add_argument("--name", default=None, help="name in the output files (default: short model name)")
    ap.add_argument("--out-dir", default=str(REPO / "eval" / "results"))
    args = ap.parse_args(argv)
    argv_used = argv if argv is not None else sys.argv[1:]

    from gaac_hf.calibration import CalibrationTable, format_position_table, model_kv_shape, table_from_stats
    from gaac_hf.calibration.collect import collect_kv_stats, default_position_ranges, roundtrip, run_chunks, split_chunks, tokenize
    from gaac_hf.format import FORMAT_VERSION
    from gaac_hf.models import load_named_model

    t0 = time.time()
    model, tok, model_name = load_named_model(args.model, dtype=torch.bfloat16)
    shape = model_kv_shape(model.config)
    short = args.name or ("smollm2" if model_name.lower().startswith("smollm2") else model_name.lower().replace("-", ""))
    axes = args.axes.split(",")
    ranges = default_position_ranges(args.context)

    calib_context = args.calib_context or args.context
    calib_text = Path(args.calib_text).read_text(encoding="utf-8")
    stats = collect_kv_stats(
        model, tok, calib_text, context=calib_context, max_tokens=args.calib_max_tokens, position_ranges=default_position_ranges(calib_context),
        keep_tokens=args.calib_max_tokens, block_size=args.block_size, full_cache=args.full_cache,
    )
    calib_name = f"{Path(args.calib_text).parent.name}/{Path(args.calib_text).name}"
    tables = {
        a: table_from_stats(model.config, stats, block_size=args.block_size, group_axis=a, model_name=model_name, text=calib_text, text_name=calib_name)
        for a in axes
    }
    del stats
    fresh = dict(tables)
    shipped_info = None
    table_path = SHIPPED.get(short) if args.table == "shipped" else args.table
    if table_path:
        shipped = CalibrationTable.load(table_path)
        shipped.check_model(model.config)
        same = torch.equal(shipped.base8, tables[axes[0]].base8) and torch.equal(shipped.base16, tables[axes[0]].base16)
        shown = Path(table_path).resolve()
        shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
        shipped_info = {"path": str(shown), "windows_equal_fresh_calibration": same, "geometry": shipped.geometry.to_dict()}
        if "upgraded_from" in shipped.meta:
            shipped_info["upgraded_from"] = shipped.meta["upgraded_from"]
        tables[axes[0]] = shipped
    print(format_position_table(tables[axes[0]].meta.get("mode_shares", {}).get("by_position", []), "calibration sample, mode shares by position"))
    t_cal = time.time() - t0

    eval_text = Path(args.eval_text).read_text(encoding="utf-8")
    chunks = split_chunks(tokenize(tok, eval_text, args.eval_max_tokens), args.context, args.block_size)
    tallies = {a: Tally(shape["num_layers"], ranges, tables[a].geometry) for a in axes}
    for _, keys, values in run_chunks(model, chunks, desc="held-out forward + codec", full_cache=args.full_cache):
        for a in axes:
            tallies[a].sequences += 1
        for li in range(shape["num_layers"]):
            for kind, x in ((0, keys[li]), (1, values[li])):
                s = x.shape[1]
                if s < args.context:  # sliding-window layer: GAAC compresses full-attention layers
                    continue
                for a in axes:
                    tallies[a].add(li, kind, *roundtrip(x, tables[a], li, kind))
    t_eval = time.time() - t0 - t_cal

    table_bytes = 2 * shape["num_layers"] * 2 * shape["num_kv_heads"] * shape["head_dim"]
    summaries = {a: summarize(tallies[a], table_bytes, shape["layer_types"]) for a in axes}
    prim = summaries[axes[0]]
    det = details(tallies[axes[0]], shape["layer_types"])
    comparison = {
        a: {k: summaries[a][k] for k in ("ratio", "ratio_with_overhead", "ratio_K", "ratio_V", "raw_group_share", "raw_block_share", "mode_shares", "bit_exact")}
        | {"escape_limit": tables[a].geometry.escape_limit}
        | ({"ratio_full_attention_layers": summaries[a]["ratio_full_attention_layers"]} if "ratio_full_attention_layers" in summaries[a] else {})
        for a in axes
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = "python eval/compression_report.py " + " ".join(shlex.quote(a) for a in argv_used)
    result = {
        "model": model_name,
        "ratio": prim["ratio"],
        "ratio_with_overhead": prim["ratio_with_overhead"],
        "bits_per_element": prim["bits_per_element"],
        "raw_group_share": prim["raw_group_share"],
        "bit_exact": all(s["bit_exact"] for s in summaries.values()),
        "command": cmd.strip(),
        "format_version": FORMAT_VERSION,
        "group_axis": axes[0],
        "definitions": DEFINITIONS,
        "primary": prim,
        "group_axis_comparison": comparison,
        "per_layer": det["per_layer"],
        "by_position": det["by_position"],
        "calibration": {
            "text": tables[axes[0]].meta.get("text"),
            "context": calib_context,
            "tokens": tables[axes[0]].meta.get("tokens"),
            "fingerprint": tables[axes[0]].meta.get("fingerprint"),
            # escape statistics of the fresh calibration (a shipped v1-upgraded table has none in its meta)
            "escapes": {a: fresh[a].meta.get("escapes") for a in axes},
            "mode_shares_by_position": tables[axes[0]].meta.get("mode_shares", {}).get("by_position"),
            "table": shipped_info,
        },
        "evaluation": {
            "text": f"{Path(args.eval_text).parent.name}/{Path(args.eval_text).name}",
            "sequences": int(chunks.shape[0]),
            "context": args.context,
            "tokens": int(chunks.numel()),
            "full_cache": args.full_cache,
            "layers_measured": [r["layer"] for r in det["per_layer"]],
        },
        "kv_shape": shape,
        "seconds": {"calibration": round(t_cal, 1), "evaluation": round(t_eval, 1)},
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    jpath = out_dir / f"compression_{short}.json"
    harness.write_result(jpath, result)
    plot(out_dir / f"compression_{short}.png", f"GAAC on {model_name}: held-out {result['evaluation']['text']}, {chunks.numel()} tokens, "
         f"context {args.context}, groups along {axes[0]}", tallies[axes[0]], det, comparison)

    print(f"{model_name}: ratio {prim['ratio']:.4f}x (codec), {prim['ratio_with_overhead']:.4f}x with overhead, "
          f"{prim['bits_per_element']:.3f} bits/element, raw groups {100 * prim['raw_group_share']:.3f}%, "
          f"raw blocks {100 * prim['raw_block_share']:.3f}%, bit-exact {result['bit_exact']}")
    for a, c in comparison.items():
        print(f"  groups along {a:7s}: ratio {c['ratio']:.4f}x, with overhead {c['ratio_with_overhead']:.4f}x, raw groups {100 * c['raw_group_share']:.3f}%")
    rows = [{"range": r["range"], "blocks": r["blocks"], "K": r["K"], "V": r["V"]} for r in det["by_position"]]
    print(format_position_table(rows, "held out, mode shares by position"))
    print(f"wrote {jpath}")
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
