"""A/B in one process: CPU pools that grow in place (reservations) vs by copying (GAAC_RESERVE=0).

Real SmolLM2 K/V (WikiText-2 test) of the first ``--layers`` layers fed token by token into a default
GAACCache (format 2 on the CPU) after a 1-token prefill, up to ``--tokens``; the modes alternate
(``--reps`` each). Per run: wall seconds of the whole walk and of its last 512 steps, and the bytes
the growth copies would have moved (the sum of the pool bytes at each growth of the copy mode).
Writes ``lab/results/reserve_walk_ab_cpu.json``.

    python lab/experiments/reserve_walk_ab.py [--layers 6] [--tokens 4096] [--reps 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "eval"))
import harness  # noqa: E402
from memory_report import real_kv  # noqa: E402


def walk(model, kv, tokens: int, mode: str) -> dict:
    from gaac_hf import GAACCache

    os.environ["GAAC_RESERVE"] = "1" if mode == "reserve" else "0"
    cache = GAACCache(model.config, calibration="smollm2-135m")
    t0 = time.perf_counter()
    t_last = None
    for n in range(tokens):
        if n == tokens - 512:
            t_last = time.perf_counter()
        for layer, (k, v) in zip(cache.layers, kv):
            layer.append(k[:, :, n : n + 1], v[:, :, n : n + 1])
    end = time.perf_counter()
    st = cache.stats()
    return {"mode": mode, "seconds": round(end - t0, 3), "last_512_steps_s": round(end - t_last, 3),
            "allocated_bytes": st["allocated_bytes"], "resident_bytes": st["resident_bytes"]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "lab" / "results" / "reserve_walk_ab_cpu.json"))
    args = ap.parse_args(argv)
    from gaac_hf.data import wikitext
    from gaac_hf.models import load_smollm2

    torch.set_num_threads(2)
    model, tok = load_smollm2()
    ids = tok(wikitext("test", True)[0], return_tensors="pt").input_ids[:, : args.tokens]
    kv = real_kv(model, ids, args.layers)
    runs = []
    for _ in range(args.reps):
        for mode in ("copy", "reserve"):
            runs.append(walk(model, kv, args.tokens, mode))
            print(runs[-1], flush=True)
    med = {m: sorted(r["seconds"] for r in runs if r["mode"] == m)[args.reps // 2] for m in ("copy", "reserve")}
    last = {m: sorted(r["last_512_steps_s"] for r in runs if r["mode"] == m)[args.reps // 2] for m in ("copy", "reserve")}
    data = {"what": "token-by-token appends of real SmolLM2 K/V into a default CPU GAACCache: pools grown in place "
                    "(reservations) vs by copying (GAAC_RESERVE=0), alternating in one process",
            "layers": args.layers, "tokens": args.tokens, "runs": runs, "median_seconds": med,
            "median_last_512_steps_s": last, "copy_over_reserve": med["copy"] / med["reserve"],
            "copy_over_reserve_last_512": last["copy"] / last["reserve"]}
    print(harness.write_result(args.out, data, shapes={"layers": args.layers, "kv_heads": 3, "head_dim": 64}))


if __name__ == "__main__":
    main()
