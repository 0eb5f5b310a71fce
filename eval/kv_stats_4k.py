"""GAACCache.stats() at a 4K-token context on SmolLM2-135M: resident KV bytes against BF16.

What it measures: the bytes a GAACCache really holds after a 4,096-token held-out WikiText-2 prompt,
for the shipped table's block size and for larger blocks (the windows do not depend on the block size),
in the storage format a default cache picks on this machine (``--format-version`` to choose: format v3,
the CPU default with the CPU library, counts its pool bytes, int64 block tables and tail; format v2 its
slot rows with their 8-byte ``esc_start``, escape streams at their exact length, raw-fallback blocks,
block tables, tail; v2 rows add ``slot_bytes``, ``escape_limit`` and the no-escape bound).

The prompt's K/V come from one DynamicCache prefill and are compressed with
GAACCache.from_dynamic_cache: the stored bytes do not depend on how the tokens arrived.

    python eval/kv_stats_4k.py [--block-sizes 64 128 256] [--out eval/results/kv_stats_4k_smollm2.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def prefill(model, ids: torch.Tensor):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    return cache


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--out", default=str(REPO / "eval" / "results" / "kv_stats_4k_smollm2.json"))
    ap.add_argument("--format-version", type=int, choices=(2, 3), default=None,
                    help="storage format (default: what a GAACCache picks on this machine)")
    args = ap.parse_args(argv)

    from gaac_hf.cache import GAACCache
    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.data import wikitext
    from gaac_hf.models import load_smollm2

    t0 = time.time()
    model, tok = load_smollm2()
    table = CalibrationTable.load(args.table)
    n = args.context
    test_ids = tok(wikitext("test")[0],
                   return_tensors="pt").input_ids[:, :n]
    if test_ids.shape[1] < n:
        raise SystemExit(f"held-out text has only {test_ids.shape[1]} tokens")
    held_out = prefill(model, test_ids)
    print(f"prefill done in {time.time() - t0:.0f}s", flush=True)

    runs = []
    for t in args.block_sizes:
        t1 = time.time()
        cache = GAACCache.from_dynamic_cache(held_out, model.config, table, block_size=t,
                                             format_version=args.format_version)
        st = cache.stats()
        row = {"block_size": t, "format_version": st["format_version"]}
        if st["format_version"] == 2:
            g = cache.geometry
            row |= {"slot_bytes": st["slot_bytes"], "escape_limit": g.escape_limit,
                    # the ratio if every block used no escape byte (planes + esc_start + table entry only)
                    "no_escape_bound_ratio": g.raw_bytes / (g.slot_bytes + 8 + 4),
                    "escape_bytes_per_slot_row": round(st["escape_bytes"] / max(st["slot_rows"], 1), 3)}
        row |= {k: st[k] for k in ("ratio", "savings", "resident_bytes", "allocated_bytes", "bf16_bytes",
                                   "raw_fallback_blocks", "stored_blocks", "tail_tokens",
                                   "mode_shares", "mode_shares_k", "mode_shares_v")}
        row["meets_target"] = st["ratio"] >= 1.40
        row["encode_seconds"] = round(time.time() - t1, 1)
        runs.append(row)
        print(json.dumps(row), flush=True)
        del cache

    out = {
        "model": "SmolLM2-135M-Instruct",
        "context": n,
        "table": str(Path(args.table).resolve().relative_to(REPO)) if Path(args.table).resolve().is_relative_to(REPO) else args.table,
        "table_geometry": table.geometry.to_dict(),
        "prompt": "WikiText-2 raw test (held out), first tokens",
        "target": "ratio >= 1.40 (resident KV >= 25% below BF16)",
        "runs": runs,
        "command": " ".join(["python eval/kv_stats_4k.py", *(argv if argv is not None else sys.argv[1:])]),
        "format_version": runs[0]["format_version"],
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    harness.write_result(Path(args.out), out)
    print(f"wrote {args.out} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
