"""How many blocks a KV budget holds under GAAC serving, and how full a slot gets on real K/V (CPU).

    python eval/serving_capacity.py --out eval/results/serving_capacity_smollm2.json

1. Real SmolLM2-135M K/V (WikiText-2 test, ``--tokens`` tokens from each of two places): every 64-token
   block of every layer, K and V of all kv heads, encoded in format v3 with the shipped table; the
   bytes a block takes in a slot area (compressed v3 blocks, or BF16 where one does not compress) as a
   fraction of its BF16 bytes. The serving default ``slot_fraction`` must sit above the largest one
   (``overflows_at_default`` counts blocks that would stay BF16).
2. Blocks a budget holds: the BF16 engine (``bf16_serving_config``) and GAAC (``gaac_serving``: slots,
   default open BF16 frames and the entry table all paid from the budget), for SmolLM2 and for the
   Qwen3-8B attention shape (36 layers, 8 kv heads, d=128; arithmetic from the same sizes).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # eval/harness.py
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def block_fractions(model, tok, table, text: str, start: int, tokens: int) -> torch.Tensor:
    from transformers import DynamicCache

    from gaac_hf.cache.pool_v3 import _BlockPoolV3, geometry_v3

    g = geometry_v3(table.geometry)
    ids = tok(text[start: start + 12 * tokens], return_tensors="pt").input_ids[:, :tokens]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache))
    nb = ids.shape[1] // g.block_size
    total = torch.zeros(nb, dtype=torch.int64)
    raw = 0
    for layer in range(model.config.num_hidden_layers):
        for kind, name in enumerate(("keys", "values")):
            x = getattr(cache.layers[layer], name)[0]  # [H, S, D]
            h = x.shape[0]
            blocks = x[:, : nb * g.block_size].reshape(h * nb, g.block_size, g.head_dim).contiguous()
            enc = _BlockPoolV3(g, *table.bases(layer, kind), "cpu").encode(blocks, torch.arange(h).repeat_interleave(nb))
            total += torch.where(enc.fits, enc.nbytes.to(torch.int64), g.raw_bytes).view(h, nb).sum(0)
            raw += h * nb * g.raw_bytes
    return total.double() / (raw / nb)


def capacity_rows(model_config, calibration, budgets_gb) -> list:
    from gaac_hf.integrations.serving import bf16_serving_config, gaac_serving

    class _Model:  # what the config helpers read from a model
        config, dtype = model_config, torch.bfloat16

    rows = []
    for gb in budgets_gb:
        budget = int(gb * (1 << 30))
        bf16 = bf16_serving_config(_Model, budget).num_blocks
        with gaac_serving(_Model, calibration, kv_budget_bytes=budget) as serving:
            gaac, frames, page = serving.config.num_blocks, serving.open_pages, serving.page_size
        rows.append(dict(budget_gib=gb, page_size=page, open_pages=frames, bf16_blocks=bf16, gaac_blocks=gaac,
                         gain=gaac / bf16, bf16_tokens=bf16 * page, gaac_tokens=gaac * page))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args(argv)
    from transformers import Qwen3Config

    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.calibration.shipped import find_table
    from gaac_hf.data import wikitext
    from gaac_hf.integrations.serving import DEFAULT_SLOT_FRACTION
    from gaac_hf.models import load_smollm2

    model, tok = load_smollm2()
    table = CalibrationTable.load(find_table("smollm2-135m"))
    text = wikitext("test", True)[0]
    fr = torch.cat([block_fractions(model, tok, table, text, s, args.tokens) for s in (0, 200_000)])
    q = torch.quantile(fr, torch.tensor([0.0, 0.5, 0.99, 1.0], dtype=torch.float64)).tolist()
    qwen = Qwen3Config(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    # a table of the Qwen3 shape for the arithmetic (its windows do not enter the block counts)
    from gaac_hf.format import BlockGeometry
    z = torch.full((36, 2, 8, 128), 120, dtype=torch.uint8)
    qwen_table = CalibrationTable(z, z.clone(), BlockGeometry(64, 128), {})
    result = dict(harness.provenance(argv=sys.argv), data="WikiText-2 test, SmolLM2-135M, shipped table, format v3",
                  tokens_per_place=args.tokens, places=[0, 200_000], blocks=int(fr.numel()),
                  block_fraction=dict(mean=float(fr.mean()), q0=q[0], q50=q[1], q99=q[2], q100=q[3]),
                  slot_fraction_default=DEFAULT_SLOT_FRACTION,
                  overflows_at_default=int((fr > DEFAULT_SLOT_FRACTION).sum()),
                  capacity=dict(smollm2=capacity_rows(model.config, table, (0.25, 1, 4)),
                                qwen3_8b_shape=capacity_rows(qwen, qwen_table, (8, 16))))
    harness.write_result(args.out, result)
    print(f"block fraction mean {fr.mean():.4f} q0 {q[0]:.4f} q99 {q[2]:.4f} max {q[3]:.4f}; overflows at "
          f"{DEFAULT_SLOT_FRACTION}: {result['overflows_at_default']} of {fr.numel()}")
    for name, rows in result["capacity"].items():
        for r in rows:
            print(f"{name} {r['budget_gib']} GiB: bf16 {r['bf16_blocks']} blocks, gaac {r['gaac_blocks']} "
                  f"({r['gain']:.3f}x, {r['open_pages']} open pages)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
