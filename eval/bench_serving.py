"""Equal-budget serving: transformers' continuous batching with its BF16 paged cache vs GAAC pages.

    python eval/bench_serving.py --out eval/results/serving_cpu_smollm2.json                 # CPU, small
    python eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8,16 --requests 48 \\
        --prompt-min 8192 --prompt-max 32768 --new-tokens 256 --out eval/results/serving_h200.json

For each KV budget both engines get the same bytes of KV storage (``bf16_serving_config`` /
``gaac_serving``: for GAAC the bytes pay for the compressed slots, the BF16 frames of open blocks and
the entry table), the same page size and batch limits, and the same requests (prompts cut from
WikiText-2 on the CPU; random token ids for the random-init 8B-shaped model). Measured per engine:
``max_concurrent`` (most requests holding KV at one time, counted at the full-attention allocator),
``mean_decoding`` (requests in their decode phase averaged over the run, :func:`mean_decoding`),
``max_decoding`` (most requests in their decode phase at one instant, :func:`max_decoding`: unlike
``max_concurrent`` it does not count a request that holds blocks mid-prefill and is then preempted),
aggregate output tokens/s over the run (wall time), median time to first token, blocks in the pool,
KV bytes per token (budget / tokens the pool holds), preemptions, and whether every request's tokens
equal the BF16 engine's (``same_tokens``: expected whenever the two engines make the same scheduling
decisions, which they do not have to at equal bytes: on a GPU a different batch composition changes
the matmul shapes and so the rounding, and a random-init model's near-tied logits flip).
The lossless check is the ``twin`` run: the BF16 engine given as many blocks as the GAAC pool holds
(more bytes than the budget) makes the same scheduling decisions, so its tokens must equal GAAC's
exactly (``twin.same_tokens_as_gaac``); its tokens/s isolates what reading GAAC pages costs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # eval/harness.py
import harness  # noqa: E402


class _Concurrency:
    """Most requests holding blocks at once, counted where every full-attention allocator allocates
    (5.23+: ``cache_allocators.FullAttentionCacheAllocator.allocate_cache_to_request``; 5.17:
    ``cache_manager.FullAttentionCacheAllocator.allocate_blocks``)."""

    def __init__(self):
        try:
            from transformers.generation.continuous_batching.cache_allocators import FullAttentionCacheAllocator as cls
            name = "allocate_cache_to_request"
        except ImportError:
            from transformers.generation.continuous_batching.cache_manager import FullAttentionCacheAllocator as cls
            name = "allocate_blocks"
        self.cls, self.name, self.peak = cls, name, 0
        self.saved = getattr(cls, name)
        meter = self

        def allocate(alloc, *args):
            out = meter.saved(alloc, *args)
            meter.peak = max(meter.peak, len(alloc.block_table))
            return out

        setattr(cls, name, allocate)

    def close(self):
        setattr(self.cls, self.name, self.saved)


def _model(name: str, device: str):
    if name == "smollm2":
        from gaac_hf.models import load_smollm2

        model, tok = load_smollm2()
        return model.to(device), tok, "smollm2-135m"
    if name in ("qwen3-8b-random", "qwen3-tiny-random"):  # the end-to-end bench's model and table
        import bench_e2e

        model = bench_e2e.build_model(torch.device(device), tiny=name == "qwen3-tiny-random")
        return model, None, bench_e2e.calibrate_random(model, torch.device(device), tokens=512 if "tiny" in name else 4096)
    raise ValueError(f"unknown model {name!r}")


def _prompts(tok, n, lo, hi, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    if tok is None:
        return [torch.randint(0, vocab, (k,), generator=gen).tolist() for k in lens]
    from gaac_hf.data import wikitext

    ids = tok(wikitext("test", True)[0][:400000]).input_ids
    starts = torch.randint(0, len(ids) - hi, (n,), generator=gen).tolist()
    return [ids[s: s + k] for s, k in zip(starts, lens)]


def _run(model, ids, gen, cb_config):
    meter = _Concurrency()
    try:
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=ids, generation_config=gen, continuous_batching_config=cb_config,
                                   progress_bar=False, record_timestamps=True)
        wall = time.perf_counter() - t0
    finally:
        meter.close()
    tokens = sum(len(o.generated_tokens) for o in out.values())
    ttft = [o.timestamps[0] - o.created_time for o in out.values() if o.timestamps]
    return out, dict(max_concurrent=meter.peak, mean_decoding=mean_decoding(out.values(), wall),
                     max_decoding=max_decoding(out.values()), wall_s=wall,
                     output_tokens=tokens, tokens_per_s=tokens / wall, ttft_median_s=statistics.median(ttft) if ttft else None)


def max_decoding(outputs) -> int:
    """Most requests decoding at one instant: the deepest overlap of the spans from each request's first to its last
    output token (a span ending when another starts does not overlap it; one-token requests have no span)."""
    events = []
    for o in outputs:
        ts = getattr(o, "timestamps", None) or ()
        if len(ts) > 1:
            events += [(ts[0], 1), (ts[-1], -1)]
    depth = peak = 0
    for _, step in sorted(events):  # at equal times -1 sorts first: an end frees its place before a start takes it
        depth += step
        peak = max(peak, depth)
    return peak


def mean_decoding(outputs, wall: float) -> float:
    """Requests in their decode phase, averaged over the run: the sum over requests of the time from
    their first to their last output token, over the wall time. Unlike ``max_concurrent`` (one peak,
    quantized when only a few long prompts fit) it shows how many sequences the pool kept going."""
    spans = [o.timestamps[-1] - o.timestamps[0] for o in outputs if len(getattr(o, "timestamps", None) or ()) > 1]
    return sum(spans) / wall if wall > 0 else 0.0


def _digests(outputs):
    """request id -> sha256 of its generated token ids (lets a later process compare tokens without storing them)."""
    return {str(r): hashlib.sha256(str(list(o.generated_tokens)).encode()).hexdigest()[:16]
            for r, o in sorted(outputs.items(), key=lambda kv: str(kv[0]))}


def _earlier_bf16(path, result):
    """budget bytes -> BF16 engine row of an earlier run with the same prompts, limits and output length."""
    with open(path) as f:
        old = json.load(f)
    for key in ("model", "prompt_tokens", "new_tokens", "limits"):
        if old.get(key) != result[key]:
            raise SystemExit(f"--bf16-from {path}: its {key} ({old.get(key)!r}) differs from this run's ({result[key]!r})")
    return {row["budget_bytes"]: row["bf16"] for row in old["rows"] if "bf16" in row}


def _progress(out, result, label, stats):
    """Write what has been measured so far (a run cut by a time limit keeps its finished engines)."""
    harness.write_result(out, dict(result, partial=True))
    print(f"  {label}: {stats['tokens_per_s']:.1f} tok/s, {stats['wall_s']:.0f} s, max concurrent "
          f"{stats['max_concurrent']}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "qwen3-8b-random", "qwen3-tiny-random"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budgets-gb", default="0.09", help="comma-separated KV budgets in GiB")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--prompt-min", type=int, default=300)
    ap.add_argument("--prompt-max", type=int, default=500)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--max-requests", type=int, default=8)
    ap.add_argument("--fused-decode", action="store_true",
                    help="gaac_serving(fused_decode=True): the fused v3 kernel, with a message wherever it cannot run "
                         "(the default, None, uses it wherever it can run)")
    ap.add_argument("--decoded-pages", action="store_true",
                    help="gaac_serving(fused_decode=False): decode steps read decoded pages (the path before the fused kernel)")
    ap.add_argument("--skip-twin", action="store_true",
                    help="leave out the twin run (BF16 engine with GAAC's block count). With --fused-decode on a GPU "
                         "the twin is not a bit-identity check anyway (transformers' attention and the fused kernel "
                         "add in other orders; tests/test_serving_gpu.py checks the fused path against its BF16 twin)")
    ap.add_argument("--bf16-from", default=None,
                    help="take the BF16 engine's rows from this earlier result of the same arguments (prompt lengths "
                         "are checked) instead of running it again; tokens are compared through the digests it stored, "
                         "where it has them")
    args = ap.parse_args(argv)
    if args.fused_decode and args.decoded_pages:
        ap.error("--fused-decode and --decoded-pages exclude each other")
    fused = True if args.fused_decode else (False if args.decoded_pages else None)
    from transformers import GenerationConfig

    from gaac_hf.integrations.serving import bf16_serving_config, gaac_serving

    model, tok, calibration = _model(args.model, args.device)
    ids = _prompts(tok, args.requests, args.prompt_min, args.prompt_max, model.config.vocab_size)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    limits = dict(max_batch_tokens=args.max_batch_tokens, max_requests_per_batch=args.max_requests)
    result = dict(harness.provenance(argv=sys.argv), model=args.model, device=args.device, requests=args.requests,
                  fused_decode={True: "on", False: "off", None: "default"}[fused],
                  prompt_tokens=[len(x) for x in ids], new_tokens=args.new_tokens, limits=limits, rows=[])
    earlier = _earlier_bf16(args.bf16_from, result) if args.bf16_from else {}
    for gb in (float(x) for x in args.budgets_gb.split(",")):
        budget = int(gb * (1 << 30))
        row = dict(budget_bytes=budget)
        bf16_cfg = bf16_serving_config(model, budget, **limits)
        result["rows"].append(row)
        if budget in earlier:
            ref, row["bf16"] = None, dict(earlier[budget], from_file=args.bf16_from)
        else:
            ref, row["bf16"] = _run(model, ids, gen, bf16_cfg)
            row["bf16"]["token_digests"] = _digests(ref)
        row["bf16"]["blocks"] = bf16_cfg.num_blocks
        _progress(args.out, result, f"{gb:g} GiB bf16", row["bf16"])
        with gaac_serving(model, calibration, kv_budget_bytes=budget, fused_decode=fused, **limits) as serving:
            out, row["gaac"] = _run(model, ids, gen, serving.config)
        st = serving.stats()
        cache = serving.caches[-1]
        batch = cache.batch if hasattr(cache, "batch") else cache.cache_allocators["full_attention"].batch
        row["gaac"]["fused_layer_steps"] = batch.fused_steps
        page = serving.page_size
        row["gaac"].update(blocks=st["gaac_blocks"], preemptions=st["preemptions"], overflow_blocks=st["overflow_blocks"],
                           open_pages=serving.open_pages, pool=st)
        row["gaac"]["token_digests"] = _digests(out)
        if ref is not None:
            row["gaac"]["same_tokens"] = all(out[r].generated_tokens == ref[r].generated_tokens for r in ref)
        else:  # BF16 row from an earlier process: compare the digests it stored (None where it stored none)
            old = row["bf16"].get("token_digests")
            row["gaac"]["same_tokens"] = None if old is None else old == row["gaac"]["token_digests"]
        for kind in ("bf16", "gaac"):
            row[kind]["kv_bytes_per_token"] = budget / (row[kind]["blocks"] * page)
        row["concurrency_gain"] = row["gaac"]["max_concurrent"] / max(row["bf16"]["max_concurrent"], 1)
        if "max_decoding" in row["gaac"] and "max_decoding" in row["bf16"]:
            row["decoding_gain"] = row["gaac"]["max_decoding"] / max(row["bf16"]["max_decoding"], 1)
        row["throughput_gain"] = row["gaac"]["tokens_per_s"] / row["bf16"]["tokens_per_s"]
        _progress(args.out, result, f"{gb:g} GiB gaac", row["gaac"])
        if args.skip_twin:
            print(f"budget {gb:g} GiB: blocks bf16 {row['bf16']['blocks']} gaac {row['gaac']['blocks']}; concurrent "
                  f"{row['bf16']['max_concurrent']} -> {row['gaac']['max_concurrent']}; tok/s "
                  f"{row['bf16']['tokens_per_s']:.1f} -> {row['gaac']['tokens_per_s']:.1f} (twin skipped)", flush=True)
            continue
        twin_cfg = bf16_serving_config(model, st["gaac_blocks"] * st["bf16_bytes_per_block"], **limits)
        twin, row["twin"] = _run(model, ids, gen, twin_cfg)
        row["twin"].update(blocks=twin_cfg.num_blocks,
                           same_tokens_as_gaac=all(out[r].generated_tokens == twin[r].generated_tokens for r in twin))
        print(f"budget {gb:g} GiB: blocks bf16 {row['bf16']['blocks']} gaac {row['gaac']['blocks']}; concurrent "
              f"{row['bf16']['max_concurrent']} -> {row['gaac']['max_concurrent']}; tok/s {row['bf16']['tokens_per_s']:.1f} "
              f"-> {row['gaac']['tokens_per_s']:.1f}; same tokens {row['gaac']['same_tokens']}; twin ({row['twin']['blocks']} "
              f"BF16 blocks) {row['twin']['tokens_per_s']:.1f} tok/s, same as GAAC {row['twin']['same_tokens_as_gaac']}",
              flush=True)
    harness.write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
