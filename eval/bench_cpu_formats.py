"""CPU decode step per storage format, one process: DynamicCache + sdpa vs GAACCache as format v3 with decode +
SDPA (the CPU default: the CPU library's C++ decoder, bit-identical to DynamicCache), v3 with the tiled attention
(``fused=True``), and format v2 (the CPU default until session 20: the PyTorch reference decoder, run
``DECODE_CHUNK`` blocks per call, and the whole layer per call as before).

SmolLM2-135M, 2 threads, WikiText-2 test prefix of ``--contexts`` tokens prefilled once per cache
(``logits_to_keep=1``, as generate() does), then ``--steps`` greedy decode steps, the caches stepping in turn
so that they share the machine's load; medians. ``same_last_tokens``: each GAAC cache's last greedy token equals
DynamicCache's. Writes ``eval/results/cpu_formats_smollm2.json``.

    python eval/bench_cpu_formats.py [--contexts 1024 4096 8192] [--steps 6]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=str(harness.RESULTS / "cpu_formats_smollm2.json"))
    args = ap.parse_args(argv)
    from transformers import DynamicCache

    import gaac_hf
    import gaac_hf.cache.pool as P
    from gaac_hf import GAACCache
    from gaac_hf.data import wikitext
    from gaac_hf.models import load_smollm2

    torch.set_num_threads(2)
    gaac_hf.register()
    model, tok = load_smollm2()
    chunk = P.DECODE_CHUNK
    rows = []
    for ctx in args.contexts:
        ids = tok(wikitext("test", True)[0], return_tensors="pt").input_ids[:, :ctx]
        cal = "smollm2-135m"
        kinds = {"dynamic": (DynamicCache(config=model.config), "sdpa", chunk),
                 # the default: format v3, decode (the CPU library) + SDPA, bit-identical to DynamicCache + sdpa
                 "gaac_v3_decode_sdpa": (GAACCache(model.config, calibration=cal), "gaac", chunk),
                 # format v3, the tiled C++ attention over the compressed blocks (not bit-identical logits)
                 "gaac_v3_tiled": (GAACCache(model.config, calibration=cal, format_version=3, fused=True), "gaac", chunk),
                 # format v2: the PyTorch reference decoder, DECODE_CHUNK blocks per call / the whole layer per call
                 "gaac_v2": (GAACCache(model.config, calibration=cal, format_version=2), "gaac", chunk),
                 "gaac_v2_whole_layer": (GAACCache(model.config, calibration=cal, format_version=2), "gaac", 1 << 30)}
        nxt, times = {}, {k: [] for k in kinds}
        with torch.no_grad():
            for name, (cache, impl, _) in kinds.items():
                model.set_attn_implementation(impl)
                nxt[name] = model(ids, **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
            for _ in range(args.steps):
                for name, (cache, impl, c) in kinds.items():
                    model.set_attn_implementation(impl)
                    P.DECODE_CHUNK = c
                    t0 = time.perf_counter()
                    nxt[name] = model(nxt[name], **cache_kwargs(model, cache), logits_to_keep=1).logits[:, -1:].argmax(-1)
                    times[name].append(time.perf_counter() - t0)
        P.DECODE_CHUNK = chunk
        model.set_attn_implementation("sdpa")
        med = {k: statistics.median(v) for k, v in times.items()}
        same = {k: bool(torch.equal(nxt["dynamic"], nxt[k])) for k in kinds if k != "dynamic"}
        rows.append({"context": ctx, "s_per_step": med, "s_per_step_all": times, "same_last_tokens": same,
                     "v2_chunked_vs_whole_layer": med["gaac_v2_whole_layer"] / med["gaac_v2"],
                     "dynamic_vs": {k: med["dynamic"] / med[k] for k in kinds if k != "dynamic"}})
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items() if k != "s_per_step_all"}, flush=True)
    data = {"what": "CPU decode step per storage format (SmolLM2-135M, 2 threads): DynamicCache + sdpa, GAACCache v3 "
                    "decode + SDPA (the default), v3 tiled (fused=True), v2 (reference decoder DECODE_CHUNK blocks per "
                    "call, and the whole layer per call); one process, caches stepping in turn, medians",
            "decode_chunk": chunk, "steps": args.steps, "threads": 2, "rows": rows}
    print(harness.write_result(args.out, data, shapes={"model": "SmolLM2-135M", "kv_heads": 3, "head_dim": 64}))


if __name__ == "__main__":
    main()
