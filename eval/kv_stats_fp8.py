"""An FP8 GAACCache on a 4K-token held-out prompt of SmolLM2-135M: bytes against the FP8 cache, and parity.

For each FP8 format, the same held-out WikiText-2 prompt is prefilled twice, once into the FP8 cache
without GAAC (``FP8DynamicCache``) and once into ``GAACCache(kv_dtype=...)``, with the shipped FP8 table;
attention reads each cache's dequantized values, so later layers see FP8 K/V as a real FP8 cache gives
them (unlike ``eval/compression_fp8.py``, which converts a BF16 model's K/V). Recorded: ``stats()``
(resident bytes of FP8 tiles + table entries + tail against the FP8 bytes), whether every layer's
stored codes equal the baseline's (uint8 compare) and whether the prompt's last-position logits are
bit-identical.

    python eval/kv_stats_fp8.py [--context 4096] [--out eval/results/kv_stats_fp8_smollm2.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("fp8_e4m3", "fp8_e5m2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default=str(REPO / "eval" / "results" / "kv_stats_fp8_smollm2.json"))
    args = ap.parse_args(argv)

    from gaac_hf.cache import FP8DynamicCache, GAACCache, GAACFP8Layer
    from gaac_hf.calibration import FP8Table, find_table
    from gaac_hf.data import wikitext
    from gaac_hf.models import load_smollm2

    t0 = time.time()
    model, tok = load_smollm2()
    ids = tok(wikitext("test")[0], return_tensors="pt").input_ids[:, : args.context]
    if ids.shape[1] < args.context:
        raise SystemExit(f"held-out text has only {ids.shape[1]} tokens")
    runs = {}
    for dt in DTYPES:
        name = f"smollm2-135m-{dt}"
        table = FP8Table.load(find_table(name), kv_dtype=dt)
        caches = {"fp8": FP8DynamicCache(model.config, table), "gaac": GAACCache(model.config, calibration=table, kv_dtype=dt)}
        logits, secs = {}, {}
        for k, c in caches.items():
            t1 = time.time()
            with torch.no_grad():
                logits[k] = model(ids, **cache_kwargs(model, c), use_cache=True, logits_to_keep=1).logits
            secs[k] = round(time.time() - t1, 1)
        g, b = caches["gaac"], caches["fp8"]
        codes_equal = all(torch.equal(lg.codes(0), lb.keys) and torch.equal(lg.codes(1), lb.values)
                          for lg, lb in zip(g.layers, b.layers) if isinstance(lg, GAACFP8Layer))
        st = g.stats()
        runs[dt] = {
            "table": f"calibration_data/{name}.safetensors",
            "logits_bit_identical": bool(torch.equal(logits["fp8"].view(torch.int16), logits["gaac"].view(torch.int16))),
            "codes_equal": bool(codes_equal),
            "finite_logits": bool(torch.isfinite(logits["gaac"]).all()),
            **{k: st[k] for k in ("ratio_vs_fp8", "ratio", "resident_bytes", "fp8_bytes", "allocated_bytes",
                                  "allocated_vs_fp8", "raw_fallback_blocks", "encoded_blocks", "tail_tokens",
                                  "mode_shares_k", "mode_shares_v")},
            "prefill_seconds": secs,
        }
        print(dt, {k: runs[dt][k] for k in ("ratio_vs_fp8", "logits_bit_identical", "codes_equal")}, flush=True)
        del caches
    out = {
        "model": "SmolLM2-135M-Instruct",
        "context": args.context,
        "prompt": "WikiText-2 raw test (held out), first tokens; one prefill forward per cache",
        "ratio_e4m3": runs["fp8_e4m3"]["ratio_vs_fp8"],
        "ratio_e5m2": runs["fp8_e5m2"]["ratio_vs_fp8"],
        "bit_exact": all(r["logits_bit_identical"] and r["codes_equal"] for r in runs.values()),
        "runs": runs,
        "definitions": {
            "ratio_vs_fp8": "FP8 bytes of the GAAC layers' tokens / (FP8 tiles in the pools + 8-byte table entries + tail codes)",
            "codes_equal": "every GAAC layer's stored codes, decoded, equal FP8DynamicCache's uint8 codes",
            "logits_bit_identical": "last-position logits of the prefill through each cache, compared as int16",
        },
        "seconds": round(time.time() - t0, 1),
    }
    harness.write_result(Path(args.out), out, shapes={"context": args.context, "block_size": 64})
    print(f"wrote {args.out}")
    return 0 if out["bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
