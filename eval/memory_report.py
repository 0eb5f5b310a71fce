"""Memory a GAACCache really takes: allocated bytes against resident bytes and against DynamicCache.

CPU (default; writes ``eval/results/memory_smollm2.json``)::

    python eval/memory_report.py [--layers 30] [--tokens 8192] [--prefills 1 256 1024]

Real SmolLM2-135M K/V of WikiText-2 (test), fed token by token into a GAACCache with the shipped
table after a prefill of 1, 256 or 1,024 tokens, ``cache.stats()`` read after every step. ``rows``
keep every 16th length (plus the first ones); the ``summary`` of each walk is over *every* length:
the largest allocated/DynamicCache ratio from 128 tokens and from 4,096 tokens on. Then the peak
tensor bytes of ``generate()`` (``gaac_hf.cache.memory.TensorBytesMeter``) with GAACCache and with
DynamicCache, same prompt, same tokens.

GPU (``--gpu``; writes ``eval/results/memory_<card>.json``, e.g. ``memory_h100.json``)::

    python eval/memory_report.py --gpu [--contexts 32768 65536] [--gpu-layers 36]

A random-init Qwen3-8B-shaped model (``--gpu-layers`` of its 36 layers, bf16) and a table from its own
K/V (``bench_e2e.calibrate_random``): ``torch.cuda.max_memory_allocated`` during ``generate()``
(prefill of the context + 8 new tokens) with DynamicCache + sdpa and with GAACCache + gaac, minus
the memory allocated before the call (weights), plus ``cache.stats()``. With ``GAAC_RESERVE_CUDA=1`` the
pools' mapped granules (outside PyTorch's allocator) are added to GAAC's peak.
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

KEEP_EVERY = 16


def _summary(rows: list[dict]) -> dict:
    def worst(start):
        sel = [r["allocated_bytes"] / r["dynamic_bytes"] for r in rows if r["tokens"] >= start]
        return max(sel) if sel else None

    last = rows[-1]
    return {"max_allocated_vs_dynamic_from_128": worst(128), "max_allocated_vs_dynamic_from_4096": worst(4096),
            "allocated_vs_dynamic_at_end": last["allocated_bytes"] / last["dynamic_bytes"],
            "resident_vs_dynamic_at_end": last["resident_bytes"] / last["dynamic_bytes"],
            "lengths_checked": len(rows)}


def real_kv(model, ids, layers: int):
    """K/V of the model's first ``layers`` layers (they do not depend on the later ones)."""
    from transformers import DynamicCache

    full = model.model.layers
    model.model.layers = full[:layers]
    try:
        dyn = DynamicCache()
        with torch.no_grad():
            model.model(ids, **cache_kwargs(model.model, dyn), use_cache=True)
    finally:
        model.model.layers = full
    return [(layer.keys, layer.values) for layer in dyn.layers]


def generate_peaks(model, ids, new_tokens: int, calibration) -> dict:
    """Peak tensor bytes of generate() with DynamicCache + sdpa and GAACCache + gaac (CPU meter)."""
    from transformers import DynamicCache

    import gaac_hf
    from gaac_hf.cache.memory import TensorBytesMeter

    gaac_hf.register()
    out, toks = {}, {}
    for name in ("dynamic", "gaac"):
        model.set_attn_implementation("gaac" if name == "gaac" else "sdpa")
        cache = gaac_hf.GAACCache(model.config, calibration=calibration) if name == "gaac" else DynamicCache(config=model.config)
        t0 = time.time()
        with torch.no_grad(), TensorBytesMeter() as meter:
            toks[name] = model.generate(ids, **cache_kwargs(model.generate, cache), max_new_tokens=new_tokens, do_sample=False,
                                        cache_implementation=None)
        out[name] = {"peak_tensor_bytes": meter.peak_bytes, "seconds": round(time.time() - t0, 1)}
        if name == "gaac":
            out[name]["stats"] = {k: v for k, v in cache.stats().items() if isinstance(v, (int, float))}
    model.set_attn_implementation("sdpa")
    out["same_tokens"] = bool(torch.equal(toks["gaac"], toks["dynamic"]))
    out["gaac_vs_dynamic"] = out["gaac"]["peak_tensor_bytes"] / out["dynamic"]["peak_tensor_bytes"]
    return out


def cpu_report(args) -> None:
    from gaac_hf import GAACCache
    from gaac_hf.cache.memory import walk_allocation
    from gaac_hf.data import wikitext
    from gaac_hf.models import load_smollm2

    model, tok = load_smollm2()
    ids = tok(wikitext("test", True)[0], return_tensors="pt").input_ids[:, : args.tokens]
    kv = real_kv(model, ids, args.layers)
    walks = []
    for prefill in args.prefills:
        t0 = time.time()
        rows = walk_allocation(GAACCache(model.config, calibration=args.calibration), kv, prefill, args.tokens)
        kept = [r for r in rows if r["tokens"] - prefill < 64 or r["tokens"] % KEEP_EVERY == 0 or r is rows[-1]]
        walks.append({"prefill": prefill, "seconds": round(time.time() - t0, 1), "summary": _summary(rows), "rows": kept})
        print(f"prefill {prefill}: {walks[-1]['summary']}", flush=True)
    gen_ids = ids[:, : args.generate_prompt]
    gen = generate_peaks(model, gen_ids, args.generate_new, args.calibration)
    print(f"generate: {gen['gaac_vs_dynamic']:.3f}x DynamicCache's peak tensor bytes", flush=True)
    data = {
        "what": "real SmolLM2-135M K/V of WikiText-2 test fed token by token into GAACCache; allocated bytes "
                "(stats()['allocated_bytes']) vs DynamicCache's bytes for the same layers and tokens",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, bf16)", "calibration": args.calibration,
        "layers": args.layers, "tokens": args.tokens, "rows_kept": f"every {KEEP_EVERY}th length, the first 64 after "
        "each prefill and the last; summaries are over every length",
        "rows": walks[0]["rows"], "walks": walks,
        "generate": {"prompt_tokens": gen_ids.shape[1], "new_tokens": args.generate_new, **gen},
    }
    print(harness.write_result(args.out or harness.RESULTS / "memory_smollm2.json", data,
                               shapes={"layers": args.layers, "kv_heads": 3, "head_dim": 64}))


def gpu_report(args) -> None:
    import bench_e2e
    from transformers import DynamicCache

    import gaac_hf
    from gaac_hf.cache import reserve

    dev = torch.device("cuda")
    cfg = bench_e2e.qwen3_8b_config()
    cfg.num_hidden_layers = args.gpu_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[: args.gpu_layers]
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    table = bench_e2e.calibrate_random(model, dev)
    gaac_hf.register()
    rows = []
    gen = torch.Generator().manual_seed(2)
    for ctx in args.contexts:
        ids = torch.randint(0, cfg.vocab_size, (1, ctx), generator=gen).to(dev)
        row = {"context": ctx, "new_tokens": args.new_tokens}
        for name in ("dynamic", "gaac"):
            model.set_attn_implementation("gaac" if name == "gaac" else "sdpa")
            cache = gaac_hf.GAACCache(model.config, calibration=table) if name == "gaac" else DynamicCache(config=model.config)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            vmm_before = reserve.committed_bytes("cuda")
            with torch.no_grad():
                model.generate(ids, **cache_kwargs(model.generate, cache), max_new_tokens=args.new_tokens, do_sample=False,
                               cache_implementation=None)
            torch.cuda.synchronize()
            # pools in CUDA reservations (GAAC_RESERVE_CUDA=1) are outside PyTorch's allocator: their mapped
            # granules are added (they only grow during generate(), so this is their peak)
            vmm = reserve.committed_bytes("cuda") - vmm_before
            row[name] = {"max_memory_allocated": torch.cuda.max_memory_allocated(), "before": base,
                         "reserved_mapped_bytes": vmm, "peak_over_before": torch.cuda.max_memory_allocated() - base + vmm}
            if name == "gaac":
                st = cache.stats()
                row[name]["stats"] = {k: st[k] for k in ("allocated_bytes", "resident_bytes", "bf16_bytes",
                                                         "allocated_vs_bf16", "resident_vs_bf16", "raw_fallback_blocks")}
            del cache
        row["gaac_vs_dynamic_peak_over_before"] = row["gaac"]["peak_over_before"] / row["dynamic"]["peak_over_before"]
        print(row, flush=True)
        rows.append(row)
    data = {"what": "torch.cuda.max_memory_allocated of generate() (prefill + new tokens), GAACCache + gaac "
                    "vs DynamicCache + sdpa, random-init Qwen3-8B-shaped model",
            "layers": args.gpu_layers, "rows": rows}
    print(harness.write_result(args.out or harness.RESULTS / f"memory_{harness.gpu_tag()}.json", data,
                               shapes={"layers": args.gpu_layers, "kv_heads": 8, "head_dim": 128}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="the H200 measurement (random Qwen3-8B shape)")
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2 layers fed (CPU)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prefills", type=int, nargs="+", default=[1, 256, 1024])
    ap.add_argument("--calibration", default="smollm2-135m")
    ap.add_argument("--generate-prompt", type=int, default=2048)
    ap.add_argument("--generate-new", type=int, default=2)
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 65536])
    ap.add_argument("--gpu-layers", type=int, default=36)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    (gpu_report if args.gpu else cpu_report)(args)


if __name__ == "__main__":
    main()
