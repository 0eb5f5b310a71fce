"""How much the fixed-capacity slot of format v1 cost, and what per-layer capacities or larger blocks would win back.

    python eval/slot_capacity_study.py [--context 4096] [--out eval/results/slot_capacity_smollm2.json]

SmolLM2-135M on held-out WikiText-2 (first `context` tokens of wiki.test.raw), windows from the shipped
table. For each block size it encodes every full block of every layer's K and V and takes each
block's escape-stream length, then computes the resident bytes of a format-v1 store (slots holding
planes + a fixed escape capacity, raw fallbacks for blocks whose escapes overflow it, 8-byte table
entries) for (a) the best single escape capacity, (b) the best capacity per layer (K and V share one,
as the fused kernel takes one geometry per layer), (c) per layer and K/V. The capacities are chosen
on the same data they are scored on (an oracle): these are upper bounds for what calibration could
reach. Besides the oracles: ``v1_rule_capacity`` (the v1 calibration rule, quantile 0.999 of escape
bytes per block rounded up to 16, here applied to the scored data), ``shipped_capacity`` (the v1
capacity the shipped table was calibrated with, ``meta["upgraded_from"]``, scaled to the block size),
and ``v2_exact_stream_ratio``: what format v2 stores (slot of planes + the escape stream at its exact
length + 8-byte ``esc_start`` per compressed block, raw only beyond ``escape_limit``, 4-byte table
entry per block).

Historical note: this is a format-v1 study (fixed escape capacities no longer exist in v2, which
came out of it); its capacity scenarios are a model of the v1 store, not of anything gaac-hf holds
now. ``eval/results/slot_capacity_smollm2.json`` was first written under v1 (the numbers quoted in
lab/NOTES.md) and has been regenerated under v2 with the added fields: the v1 scenario numbers
depend only on escape lengths and windows (unchanged by v2; the shipped table was upgraded with its
windows bit-identical), and reproduce the v1 file (checked: equal to 1e-9 relative; sums are now in float64).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def resident(esc: torch.Tensor, fixed: int, raw: int, cap: int) -> float:
    """Format-v1 bytes: slots of ``fixed + cap`` bytes, raw fallbacks, an 8-byte table entry per block."""
    esc = esc.double()  # float32 sums of ~1e8 bytes round
    return float(torch.where(esc <= cap, float(fixed + cap), float(raw)).sum()) + 8 * esc.numel()


def resident_v2(esc: torch.Tensor, slot: int, raw: int, limit: int) -> float:
    """Format-v2 bytes: slot + exact stream + 8-byte esc_start (raw beyond ``limit``), 4-byte table entry."""
    esc = esc.double()
    return float(torch.where(esc <= limit, slot + esc + 8.0, float(raw)).sum()) + 4 * esc.numel()


def v1_rule(esc: torch.Tensor, quantile: float = 0.999) -> int:
    """The v1 calibration rule: quantile of escape bytes per block, rounded up to 16 (>= 16)."""
    q = float(torch.quantile(esc.double(), quantile))
    return max(16, 16 * int((q + 15) // 16))


def best(esc: torch.Tensor, fixed: int, raw: int) -> tuple[float, int]:
    return min((resident(esc, fixed, raw, c), c) for c in range(0, int(esc.max()) + 16, 16))


def main(argv=None):
    from transformers import DynamicCache

    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.codec import encode_blocks
    from gaac_hf.format import FORMAT_VERSION, BlockGeometry
    from gaac_hf.models import load_smollm2

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--table", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    p.add_argument("--text", default=None, help="held-out text (default: WikiText-2 test, found as gaac_hf.data says)")
    p.add_argument("--out", default=str(REPO / "eval" / "results" / "slot_capacity_smollm2.json"))
    args = p.parse_args(argv)
    model, tok = load_smollm2()
    from gaac_hf.data import wikitext

    text = Path(args.text).read_text(encoding="utf-8") if args.text else wikitext("test")[0]
    ids = tok(text[: args.context * 16], return_tensors="pt").input_ids[:, : args.context]
    if ids.shape[1] < args.context:
        sys.exit(f"text too short for {args.context} tokens")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
    table = CalibrationTable.load(args.table)
    shipped_cap = (table.meta.get("upgraded_from") or {}).get("escape_capacity")  # v1 capacity, if upgraded
    rows = []
    for t in args.block_sizes:
        d = table.geometry.head_dim
        geometry = BlockGeometry(t, d, table.geometry.group_axis)
        # v1's slot = these same planes (16-byte aligned) + the escape capacity
        fixed, raw = geometry.slot_bytes, geometry.raw_bytes
        esc = {}
        for li, layer in enumerate(cache.layers):
            for kind, x in ((0, layer.keys[0]), (1, layer.values[0])):
                h, s, _ = x.shape
                nb = s // t
                b8, b16 = table.bases(li, kind)
                e = encode_blocks(x[:, : nb * t].reshape(h * nb, t, d), b8.repeat_interleave(nb, 0), b16.repeat_interleave(nb, 0), geometry)
                esc[(li, kind)] = e.escape_len.float()
        allv = torch.cat(list(esc.values()))
        bf16 = raw * allv.numel()
        g_bytes, g_cap = best(allv, fixed, raw)
        per_layer = sum(best(torch.cat([esc[(li, 0)], esc[(li, 1)]]), fixed, raw)[0] for li in range(len(cache.layers)))
        per_kind = sum(best(v, fixed, raw)[0] for v in esc.values())
        rule_cap = v1_rule(allv)
        row = {
            "block_size": t, "blocks": int(allv.numel()), "escape_mean": float(allv.mean()),
            "escape_p99": float(torch.quantile(allv, 0.99)), "escape_max": float(allv.max()),
            "codec_ratio": bf16 / (fixed * allv.numel() + float(allv.double().sum())),
        }
        if shipped_cap is not None:
            cap = shipped_cap * t // table.geometry.block_size
            row |= {"shipped_capacity": cap, "shipped_capacity_ratio": bf16 / resident(allv, fixed, raw, cap)}
        row |= {
            "v1_rule_capacity": rule_cap, "v1_rule_ratio": bf16 / resident(allv, fixed, raw, rule_cap),
            "best_global_capacity": g_cap, "best_global_ratio": bf16 / g_bytes,
            "best_per_layer_ratio": bf16 / per_layer, "best_per_layer_kind_ratio": bf16 / per_kind,
            "v2_escape_limit": geometry.escape_limit,
            "v2_raw_blocks": int((allv > geometry.escape_limit).sum()),
            "v2_exact_stream_ratio": bf16 / resident_v2(allv, fixed, raw, geometry.escape_limit),
        }
        rows.append(row)
        print(json.dumps(rows[-1]))
    out = {"model": "SmolLM2-135M-Instruct", "context": args.context, "table": Path(args.table).name,
           "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
           "format_version": FORMAT_VERSION, "rows": rows}
    harness.write_result(Path(args.out), out)


if __name__ == "__main__":
    main()
