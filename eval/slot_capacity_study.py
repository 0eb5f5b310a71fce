"""How much the fixed-capacity slot costs, and what per-layer capacities or larger blocks would win back.

    python eval/slot_capacity_study.py [--context 4096] [--out eval/results/slot_capacity_smollm2.json]

SmolLM2-135M on held-out WikiText-2 (first `context` tokens of wiki.test.raw), windows from the shipped
table. For each block size it encodes every full block of every layer's K and V with an unbounded
escape area, then computes the resident bytes (slots, raw fallbacks, 8-byte table entries) for
(a) the best single escape capacity, (b) the best capacity per layer (K and V share one, as the fused
kernel takes one geometry per layer), (c) per layer and K/V. The capacities are chosen on the same
data they are scored on (an oracle): these are upper bounds for what calibration could reach.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def resident(esc: torch.Tensor, fixed: int, raw: int, cap: int) -> float:
    return float(torch.where(esc <= cap, float(fixed + cap), float(raw)).sum()) + 8 * esc.numel()


def best(esc: torch.Tensor, fixed: int, raw: int) -> tuple[float, int]:
    return min((resident(esc, fixed, raw, c), c) for c in range(0, int(esc.max()) + 16, 16))


def main(argv=None):
    from transformers import DynamicCache

    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.codec import encode_blocks
    from gaac_hf.format import BlockGeometry
    from gaac_hf.models import load_smollm2

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--table", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "wikitext-2-raw-v1" / "wiki.test.raw"))
    p.add_argument("--out", default=str(REPO / "eval" / "results" / "slot_capacity_smollm2.json"))
    args = p.parse_args(argv)
    model, tok = load_smollm2()
    ids = tok(Path(args.text).read_text(encoding="utf-8")[: args.context * 16], return_tensors="pt").input_ids[:, : args.context]
    if ids.shape[1] < args.context:
        sys.exit(f"text too short for {args.context} tokens")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=cache, logits_to_keep=1)
    table = CalibrationTable.load(args.table)
    rows = []
    for t in args.block_sizes:
        d = table.geometry.head_dim
        unbounded = BlockGeometry(t, d, 16 * ((BlockGeometry(t, d, 0).max_escape_bytes + 15) // 16))
        fixed, raw = unbounded.esc_offset, 2 * t * d
        esc = {}
        for li, layer in enumerate(cache.layers):
            for kind, x in ((0, layer.keys[0]), (1, layer.values[0])):
                h, s, _ = x.shape
                nb = s // t
                b8, b16 = table.bases(li, kind)
                e = encode_blocks(x[:, : nb * t].reshape(h * nb, t, d), b8.repeat_interleave(nb, 0), b16.repeat_interleave(nb, 0), unbounded)
                esc[(li, kind)] = e.escape_len.float()
        allv = torch.cat(list(esc.values()))
        bf16 = raw * allv.numel()
        g_bytes, g_cap = best(allv, fixed, raw)
        per_layer = sum(best(torch.cat([esc[(li, 0)], esc[(li, 1)]]), fixed, raw)[0] for li in range(len(cache.layers)))
        per_kind = sum(best(v, fixed, raw)[0] for v in esc.values())
        rows.append({
            "block_size": t, "blocks": int(allv.numel()), "escape_mean": float(allv.mean()),
            "escape_p99": float(torch.quantile(allv, 0.99)), "escape_max": float(allv.max()),
            "codec_ratio": bf16 / (fixed * allv.numel() + float(allv.sum())),
            "shipped_capacity_ratio": bf16 / resident(allv, fixed, raw, table.geometry.escape_capacity * t // table.geometry.block_size),
            "best_global_capacity": g_cap, "best_global_ratio": bf16 / g_bytes,
            "best_per_layer_ratio": bf16 / per_layer, "best_per_layer_kind_ratio": bf16 / per_kind,
        })
        print(json.dumps(rows[-1]))
    out = {"model": "SmolLM2-135M-Instruct", "context": args.context, "table": Path(args.table).name,
           "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
