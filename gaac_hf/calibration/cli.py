"""``gaac-calibrate``: calibrate GAAC exponent windows for a model and write the table.

Example (the command that made the shipped ``calibration_data/smollm2-135m.safetensors``, here
writing to a path of your own)::

    gaac-calibrate --model smollm2 --context 8192 --max-tokens 32768 --out my-smollm2.safetensors

An FP8 KV cache (``GAACCache(..., kv_dtype="fp8_e4m3")``) needs an FP8 table (static scales + windows of the
FP8 codes, :mod:`gaac_hf.calibration.fp8`)::

    gaac-calibrate --model smollm2 --kv-dtype fp8_e4m3 --context 8192 --max-tokens 32768 --out smollm2-e4m3.safetensors

Without ``--text`` / ``--dataset`` the text is WikiText-2 validation, found as :mod:`gaac_hf.data` says.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..data import DataNotFound, wikitext

def read_text(path: str | None, dataset: str | None = None, split: str = "validation") -> tuple[str, str]:
    """(text, name) from a file, or from ``datasets`` (``name[:config]``, online only)."""
    if dataset:
        try:
            import datasets
        except ModuleNotFoundError as e:
            raise SystemExit("--dataset needs the `datasets` package (pip install datasets)") from e
        name, _, config = dataset.partition(":")
        ds = datasets.load_dataset(name, config or None, split=split)
        column = "text" if "text" in ds.column_names else ds.column_names[0]
        return "\n".join(ds[column]), f"{dataset}/{split}"
    if path is None:
        try:
            text, where = wikitext("validation", raw=False)
        except DataNotFound as e:
            raise SystemExit(f"default calibration text (WikiText-2 validation) not found: {e}; pass --text PATH") from None
        p = Path(where)
        return text, (f"{p.parent.name}/{p.name}" if p.is_file() else where)
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"calibration text not found: {p}")
    return p.read_text(encoding="utf-8"), f"{p.parent.name}/{p.name}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gaac-calibrate",
        description="Calibrate GAAC exponent windows (per layer, K/V, kv-head, channel) on text and save the table.",
    )
    ap.add_argument("--model", default="smollm2", help="'smollm2', 'gemma3' (optional install) or a local transformers folder")
    ap.add_argument("--text", default=None, help="calibration text file (default: WikiText-2 validation, see gaac_hf.data)")
    ap.add_argument("--dataset", default=None, help="instead of --text: a `datasets` name[:config], e.g. wikitext:wikitext-2-raw-v1")
    ap.add_argument("--split", default="validation", help="split for --dataset (default: validation)")
    ap.add_argument("--context", type=int, default=8192, help="tokens per forward; calibrate at the deployment length (default 8192)")
    ap.add_argument("--block-size", type=int, default=64, help="tokens per block (default 64)")
    ap.add_argument("--group-axis", choices=("channel", "token"), default="channel", help="groups of 8 along channels (default) or tokens")
    ap.add_argument("--max-tokens", type=int, default=None, help="use at most this many tokens of the text (whole contexts)")
    ap.add_argument("--stats-tokens", type=int, default=None, help="tokens sampled for mode and escape statistics (default max(context, 32768))")
    ap.add_argument("--batch-size", type=int, default=1, help="contexts per forward")
    ap.add_argument("--full-cache", action="store_true", help="keep every token of sliding-window layers too (their windows are then calibrated on all positions)")
    ap.add_argument("--out", default=None, help="output table (default: ./<model>.safetensors; the shipped tables are never overwritten)")
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8_e4m3", "fp8_e5m2"), default="bf16",
                    help="the KV cache's dtype: bf16 (default) or an FP8 format (writes an FP8 table: scales + windows)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--force", action="store_true", help="write the table even if it looks degenerate (see below)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from ..models import load_named_model
    from .fit import calibrate

    text, text_name = read_text(args.text, args.dataset, args.split)
    model, tok, name = load_named_model(args.model, dtype=torch.bfloat16)
    if args.kv_dtype != "bf16":
        return _main_fp8(model, tok, text, args, text_name, name, argv)
    try:
        table = _calibrate(calibrate, model, tok, text, args, text_name, name)
    except (ValueError, TypeError) as e:  # bad input (too little text, a non-bf16 model...): one line
        raise SystemExit(f"gaac-calibrate: {e}") from None
    problems = degenerate(table)
    if problems and not args.force:
        raise SystemExit(f"gaac-calibrate: refusing to write a degenerate table ({'; '.join(problems)}): calibrate on "
                         "real text of this model at the deployment context, or pass --force")
    table.meta["command"] = "gaac-calibrate " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = Path(args.out) if args.out else Path(f"{name.lower()}.safetensors")
    table.save(out)
    _report(table, out)
    return 0


#: a table whose own sample compresses below this, or falls back to raw blocks more often, is refused
MIN_RATIO, MAX_RAW_SHARE = 1.1, 0.05


def degenerate(table) -> list[str]:
    """Why a freshly fitted table is useless (empty if it is not): its own calibration sample barely
    compresses or often falls back to raw blocks (e.g. windows that cover nothing: all-zero K/V)."""
    e = table.meta.get("escapes", {})
    out = []
    if table.base8.numel() > 1 and bool((table.base8 == table.base8.flatten()[0]).all()):
        out.append(f"every window starts at exponent {int(table.base8.flatten()[0])}: the K/V it saw were constant "
                   "(all zero?), not a model's")
    if e.get("ratio_estimate", MIN_RATIO) < MIN_RATIO:
        out.append(f"ratio on its own sample {e['ratio_estimate']:.4f}x < {MIN_RATIO}x")
    if e.get("raw_fallback_share", 0.0) > MAX_RAW_SHARE:
        out.append(f"{100 * e['raw_fallback_share']:.1f}% raw-fallback blocks > {100 * MAX_RAW_SHARE:.0f}%")
    return out


def _main_fp8(model, tok, text, args, text_name, name, argv) -> int:
    """``--kv-dtype fp8_*``: write an FP8 table (:func:`gaac_hf.calibration.fp8.calibrate_fp8`)."""
    from .fp8 import calibrate_fp8

    if args.group_axis != "channel" or args.full_cache:
        raise SystemExit("gaac-calibrate: FP8 tables group along channels over each layer's cache: drop --group-axis / --full-cache")
    try:
        table = calibrate_fp8(model, tok, text, dtype=args.kv_dtype, context=args.context, block_size=args.block_size,
                              max_tokens=args.max_tokens, text_name=text_name, model_name=name,
                              batch_size=args.batch_size, progress=not args.quiet)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"gaac-calibrate: {e}") from None
    table.meta["command"] = "gaac-calibrate " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = Path(args.out) if args.out else Path(f"{name.lower()}-{args.kv_dtype}.safetensors")
    table.save(out)
    s = table.scales
    print(f"model {name}: {args.kv_dtype} table, {table.meta['tokens']} tokens in {table.meta['chunks']} x {args.context}; "
          f"scales K {float(s[:, 0].min()):.3g}..{float(s[:, 0].max()):.3g}, V {float(s[:, 1].min()):.3g}..{float(s[:, 1].max()):.3g}")
    print(f"wrote {out}")
    return 0


def _calibrate(calibrate, model, tok, text, args, text_name, name):
    return calibrate(
        model,
        tok,
        text,
        context=args.context,
        block_size=args.block_size,
        group_axis=args.group_axis,
        max_tokens=args.max_tokens,
        text_name=text_name,
        model_name=name,
        stats_tokens=args.stats_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
        full_cache=args.full_cache,
    )


def _report(table, out) -> None:
    from .statistics import format_position_table

    m = table.meta
    print(f"model {m['model_name']} (fingerprint {m['fingerprint']}), {m['tokens']} tokens of {m['text']['name']} in {m['chunks']} x {m['context']}")
    g = table.geometry
    e = m["escapes"]
    print(
        f"geometry: block {g.block_size} x {g.head_dim}, groups along {g.group_axis}: slot {g.slot_bytes} B + escape "
        f"stream (per block: mean {e['escape_bytes_per_block']['mean']} B, p99.9 {e['escape_bytes_per_block']['p999']} B; "
        f"raw-fallback blocks {100 * e['raw_fallback_share']:.3f}%) vs {g.raw_bytes} B raw; ratio ~{e['ratio_estimate']:.4f}x"
    )
    for kind in ("K", "V"):
        s = m["mode_shares"][kind]
        print(f"{kind}: 3-bit {100 * s['3bit']:.2f}%  4-bit {100 * s['4bit']:.2f}%  raw {100 * s['raw']:.3f}% of groups")
    print(format_position_table(m["mode_shares"]["by_position"], f"mode shares by position (first {m['stats_tokens']} tokens)"))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
