"""End-to-end decode-step and prefill benchmark: GAACCache vs DynamicCache + SDPA, 8B-shaped model.

    python eval/bench_e2e.py --out eval/results/e2e_h200.json [--contexts 8192 32768 65536] [--batches 1 4]

A random-init Qwen3-8B-shaped model (36 layers, 32 q / 8 kv heads, head_dim 128, bf16) on one GPU;
speed does not depend on weight values. Calibration windows come from the model's own K/V on a 4K
random-token prefill (compression depends on values, so the ratio here says nothing about real models;
see eval/results/compression_*.json for those).

For every (batch, context):
  * prefill time (one forward of the whole prompt, logits_to_keep=1, or chunks of it when the batch
    holds more than 2^18 tokens: ``prefill_chunk`` per row) with DynamicCache and with
    GAACCache (whose prefill encodes every complete block): the difference is the encoding overhead;
  * decode-step latency, as wall time per step (host-synchronised) and as GPU busy time per step
    (sum of kernel durations from torch.profiler), for DynamicCache with SDPA pinned to the flash
    backend and to the cuDNN backend, and for GAACCache with its default decode path (on Hopper with the
    cuda extra: format v3 and the fused v3 CUDA kernel; recorded per row as ``gaac_decode_path``).
The bytes each step must read (weights + KV) are reported so the ceiling is visible: with BF16 weights
the ideal GPU-time gain is (W + KV_bf16) / (W + KV_gaac). A BF16 cache that does not fit the GPU is
recorded as ``oom_<kind>`` and the row goes on without it (GAAC may still fit where BF16 does not).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager, nullcontext

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def qwen3_8b_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rope_theta=1_000_000.0, tie_word_embeddings=False,
    )


def tiny_config():
    """A 2-layer model of the same structure, for a CPU smoke run of this script (--tiny)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=128, tie_word_embeddings=False)


_sync = harness.sync


def build_model(dev, tiny=False):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config() if tiny else qwen3_8b_config()
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def calibrate_random(model, dev, tokens=4096, block_size=64):
    """A CalibrationTable from the model's own K/V on random tokens (windows by histogram)."""
    from transformers import DynamicCache

    from gaac_hf.calibration import CalibrationTable, choose_windows, config_fingerprint, exponent_histogram, model_kv_shape
    from gaac_hf.format import BlockGeometry

    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(dev)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
    kv = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])  # [L,2,H,S,D]
    b8, b16 = choose_windows(exponent_histogram(kv))
    meta = {"model_name": "qwen3-8b-random-init", "kv_shape": model_kv_shape(model.config),
            "fingerprint": config_fingerprint(model.config), "text": "random tokens", "tokens": tokens}
    return CalibrationTable(b8.cpu(), b16.cpu(), BlockGeometry(block_size, kv.shape[-1]), meta)


@contextmanager
def inplace_static_sdpa():
    """Make the StaticCache rows an in-place BF16 reference (used around them only).

    With transformers 5.17, a StaticCache decode step (q_len 1, ``is_compileable``) always gets an
    explicit bool mask over the whole preallocated length; SDPA's flash backend takes no mask ("No
    available kernel") and with a mask transformers also drops ``enable_gqa`` and materialises
    ``repeat_kv`` (4x the K/V bytes per layer for Qwen3's 32/8 heads). Inside this context
    StaticLayer.update tracks the filled length on the host, and the "sdpa" attention function, for
    tensors so tagged, runs SDPA on the filled prefix only (``key[:, :, :n]``, no mask,
    ``enable_gqa=True``, is_causal for the prefill) under the bench's pinned backend: a BF16 cache
    written in place and read once by flash/cuDNN. Calls and contiguous-copy fallbacks are counted.
    """
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    from transformers.cache_utils import StaticLayer
    from transformers.modeling_utils import AttentionInterface

    orig_update = StaticLayer.update
    orig_sdpa = AttentionInterface._global_mapping["sdpa"]

    def update(self, key_states, value_states, *a, **k):
        k_, v_ = orig_update(self, key_states, value_states, *a, **k)
        self._host_len = getattr(self, "_host_len", 0) + key_states.shape[-2]
        k_._host_len = v_._host_len = self._host_len
        return k_, v_

    def sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        n = getattr(key, "_host_len", None)
        if n is None:
            STATIC_CALLS["stock sdpa"] += 1
            return orig_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw)
        STATIC_CALLS["in-place prefix sdpa"] += 1
        k, v = key[:, :, :n], value[:, :, :n]
        q_len = query.shape[2]
        # a prefill chunk after the first attends to the whole prefix: causal aligned lower-right
        mask = causal_lower_right(q_len, n) if 1 < q_len < n else None
        causal = q_len > 1 and mask is None
        try:
            o = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling, is_causal=causal, enable_gqa=True)
        except RuntimeError:  # a backend that refuses the strided prefix: copy it (recorded)
            STATIC_CALLS["contiguous fallback"] += 1
            o = F.scaled_dot_product_attention(query, k.contiguous(), v.contiguous(), attn_mask=mask, scale=scaling,
                                               is_causal=causal, enable_gqa=True)
        return o.transpose(1, 2).contiguous(), None

    StaticLayer.update = update
    AttentionInterface._global_mapping["sdpa"] = sdpa
    try:
        yield
    finally:
        StaticLayer.update = orig_update
        AttentionInterface._global_mapping["sdpa"] = orig_sdpa


STATIC_CALLS: dict = defaultdict(int)


gpu_busy_us = harness.gpu_busy_us
wall_us = harness.wall_us


#: prefill tokens per forward (B x chunk) above which the bench prefills in chunks
PREFILL_TOKENS = 1 << 18
#: a chunk after the first gets transformers' dense bool mask [B, 1, chunk, S], which the memory-efficient
#: kernel turns into a BF16 bias: at most this many elements (B=4 x 64K x 128K would be 34 GB; call A of
#: session 14 found FA2 refusing the masked chunk, call B an OOM on a 6 GiB bias at 2^32 elements)
PREFILL_MASK_ELEMENTS = 1 << 30


def prefill_chunk(B: int, S: int, requested: int = 0) -> int:
    """Prompt tokens per prefill forward: ``requested`` if given, else the whole prompt when B x S <=
    PREFILL_TOKENS, else the largest multiple of 64 with B x chunk <= PREFILL_TOKENS and B x chunk x S <=
    PREFILL_MASK_ELEMENTS (B=16 x 32K in one forward needs >12 GiB per MLP activation: call L1 ran out of
    memory there)."""
    if requested:
        return min(requested, S)
    if B * S <= PREFILL_TOKENS:
        return S
    return max(64, min(PREFILL_TOKENS // B, PREFILL_MASK_ELEMENTS // (B * S)) // 64 * 64)


class _Skipped(Exception):
    """A baseline left out on request (recorded in the row)."""


def run_case(model, table, B, S, dev, args, progress=None):
    import gaac_hf
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import DynamicCache, StaticCache

    g = torch.Generator(device="cpu").manual_seed(S + B)
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=g).to(dev)
    nxt = torch.randint(0, model.config.vocab_size, (B, 1), generator=g).to(dev)
    row = {"batch": B, "context": S}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    L, H, D = model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim
    row["bytes"] = {"weights": weights, "kv_bf16": 2 * L * B * H * S * D * 2}

    chunk = prefill_chunk(B, S, args.prefill_chunk)
    row["prefill_chunk"] = chunk

    def prefill(cache, upto=None):
        end = S if upto is None else min(S, upto)
        _sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for a in range(0, end, chunk):  # a long batch prefills in chunks (activations of B x chunk tokens)
                b = min(end, a + chunk)
                pos = torch.arange(a, b, device=dev).expand(B, -1)
                model(ids[:, a:b], **cache_kwargs(model, cache), position_ids=pos, logits_to_keep=1)
        _sync()
        return time.perf_counter() - t0

    def decode_fn(cache, ctx):
        # Each call appends one token at the next position (no crop: StaticCache cannot crop, and
        # cropping a DynamicCache adds copies of its own); the context grows by ~20 tokens in all.
        pos = torch.full((B, 1), S, device=dev, dtype=torch.long)

        def step():
            with torch.no_grad(), ctx():
                model(nxt, **cache_kwargs(model, cache), position_ids=pos, logits_to_keep=1)
            pos.add_(1)
        return step

    def time_graph_steps(tag, cache, seq_length=None):
        # CUDA-graph replays of the step (gaac_hf.integrations.cuda_graphs): warmed until every kind of
        # step the timed run meets is captured (GAAC: append and close, ~2 blocks of steps), then timed
        from gaac_hf.integrations.cuda_graphs import DecodeGraphs

        horizon = 2 * 64 + 8 + 4 * (args.steps + args.prof_steps)
        runner = DecodeGraphs(model, cache, horizon, seq_length=seq_length, capture=dev.type == "cuda")
        step = lambda: runner.step(nxt)  # noqa: E731
        kinds = 2 if runner.gaac is not None else 1
        with torch.no_grad():
            for _ in range(2 * 64 + 4):
                step()
                if len(runner.graphs) == kinds or dev.type != "cuda":
                    break
            row[f"step_wall_us_{tag}"] = wall_us(step, args.steps)
            row[f"step_gpu_us_{tag}"] = gpu_busy_us(step, args.prof_steps, **kernel_table(tag))
            busy_union(tag)
            # device span of a replay (events around it): kernels plus the gaps inside the graph
            row[f"step_span_us_{tag}"] = harness.span_us(step, args.steps)
        row[f"{tag}_replays"], row[f"{tag}_eager_steps"] = runner.replays, runner.eager_steps
        row[f"{tag}_kinds_captured"] = sorted(runner.graphs)
        runner.close()

    def kernel_table(tag):
        # --kernel-table: every kernel of the profiled steps with its time per step (where GPU time goes)
        if not args.kernel_table:
            return {}
        return {"kernels": row.setdefault("kernels", {}).setdefault(tag, {}),
                "gaps": row.setdefault("kernel_gaps", {}).setdefault(tag, {})}

    def busy_union(tag):
        # --kernel-table: the device time with at least one kernel running (kernels launched early under
        # programmatic dependent launch overlap their predecessor, so step_gpu_us, a sum, counts the overlap)
        gaps = row.get("kernel_gaps", {}).get(tag)
        if gaps and "busy_us" in gaps:
            row[f"step_busy_us_{tag}"] = gaps["busy_us"]

    def time_steps(tag, cache, ctx):
        step = decode_fn(cache, ctx)
        for _ in range(3):
            step()
        row[f"step_wall_us_{tag}"] = wall_us(step, args.steps)
        row[f"step_gpu_us_{tag}"] = gpu_busy_us(step, args.prof_steps, **kernel_table(tag))
        busy_union(tag)

    if dev.type != "cuda":  # CPU smoke run: SDPA picks its math backend
        sdpa_kernel = lambda b: nullcontext()  # noqa: E731
    flash = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # noqa: E731
    cudnn = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)  # noqa: E731
    extra = args.steps + args.prof_steps + 8
    # a chunk after the first carries a mask, which FA2 refuses: those prefills may also take the
    # memory-efficient kernel (the BF16 and GAAC prefills run under the same choice)
    prefill_ctx = flash if chunk >= S else (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]))
    row["prefill_backends"] = "flash" if chunk >= S else "flash+efficient"

    # ---- BF16 baselines: DynamicCache (appends by torch.cat: copies the history every step) and
    # StaticCache (preallocated, writes in place: isolates what compression itself buys) ----
    model.set_attn_implementation("sdpa")
    cache = None
    try:  # a BF16 cache that does not fit is reported and the row goes on (GAAC may still fit)
        if args.skip_dynamic:
            raise _Skipped
        with prefill_ctx():
            prefill(DynamicCache(config=model.config))  # warm-up
            samples = []
            for _ in range(args.prefill_reps - 1):  # extra samples (median), then the one whose cache is kept
                samples.append(prefill(DynamicCache(config=model.config)))
            cache = DynamicCache(config=model.config)
            samples.append(prefill(cache))
            row["prefill_s_bf16"] = statistics.median(samples)
            row["prefill_s_bf16_samples"] = samples
        for name, ctx in (("fa2", flash), ("cudnn", cudnn)) if not args.prefill_only else ():
            time_steps(name, cache, ctx)
    except torch.OutOfMemoryError as e:
        row["oom_dynamic"] = str(e)[:200]
    except _Skipped:
        row["skipped_dynamic"] = "--skip-dynamic (the issue's baseline is the in-place static cache)"
    report = progress or (lambda r: None)  # the case's rows so far, written before the next part can fail
    report(row)
    cache = None
    torch.cuda.empty_cache() if dev.type == "cuda" else None
    # one prefill serves both in-place static rows (each appends its own steps: room for two runs)
    statics = (("static_fa2", flash), ("static_cudnn", cudnn)) if not args.prefill_only else ()
    if statics:
        try:
            with inplace_static_sdpa():
                cache = StaticCache(config=model.config, max_cache_len=S + 2 * extra)
                with prefill_ctx():
                    prefill(cache)
                for name, ctx in statics:
                    time_steps(name, cache, ctx)
        except torch.OutOfMemoryError as e:
            row["oom_static"] = str(e)[:200]
        cache = None
        torch.cuda.empty_cache() if dev.type == "cuda" else None
        report(row)
    if args.graphs and not args.prefill_only and args.skip_stock_graph:
        row["skipped_static_stock_graph"] = "--skip-stock-graph"
    elif args.graphs and not args.prefill_only:
        # transformers' own StaticCache decode (a mask over the whole preallocated length, SDPA's backend
        # choice) replayed from a graph: what generate(cache_implementation="static") + graphs runs. The
        # in-place prefix rows above slice a host length each step, which a graph cannot replay.
        try:
            with inplace_static_sdpa():
                cache = StaticCache(config=model.config, max_cache_len=S + 2 * 64 + 8 + 4 * extra)
                with prefill_ctx():
                    prefill(cache)
            time_graph_steps("static_stock_graph", cache, seq_length=S)
        except torch.OutOfMemoryError as e:
            row["oom_static_stock_graph"] = str(e)[:200]
        except Exception as e:  # noqa: BLE001 - a baseline that cannot be captured is reported, the row goes on
            row["error_static_stock_graph"] = f"{type(e).__name__}: {e}"[:300]
        cache = None
        torch.cuda.empty_cache() if dev.type == "cuda" else None
        report(row)

    # ---- GAAC (prefill under the same pinned SDPA backend as the BF16 prefill) ----
    gaac_hf.register()
    model.set_attn_implementation("gaac")
    try:
        with prefill_ctx():
            # warm-up (kernels compiled, first chunk and a masked one): two chunks, not the whole context, so that
            # a large batch's warm cache is not alive beside the timed one (B=16 32K format v4 ran out of memory,
            # lab/cuda-decode-notebook.md session 19)
            warm = gaac_hf.GAACCache(model.config, calibration=table, fused=args.fused, format_version=args.format_version)
            prefill(warm, upto=2 * chunk)
            del warm
            gc.collect()
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            samples = []
            for _ in range(args.prefill_reps - 1):
                samples.append(prefill(gaac_hf.GAACCache(model.config, calibration=table, fused=args.fused, format_version=args.format_version)))
            cache = gaac_hf.GAACCache(model.config, calibration=table, fused=args.fused, format_version=args.format_version)
            samples.append(prefill(cache))
            row["prefill_s_gaac"] = statistics.median(samples)
            row["prefill_s_gaac_samples"] = samples
        row["gaac_format_version"] = cache.layers[0].format_version
        row["gaac_decode_path"] = (f"fused v{cache.layers[0].format_version} CUDA"
                                   if getattr(cache.layers[0], "fused_v3", False) and args.fused
                                   else "fused v2 Triton" if cache.layers[0].format_version == 2 and args.fused
                                   and dev.type == "cuda"
                                   else "decode + SDPA")
        st = cache.stats()
        row["gaac_stats"] = {k: st[k] for k in ("resident_bytes", "bf16_bytes", "ratio", "raw_fallback_blocks", "mode_shares")}
        row["bytes"]["kv_gaac"] = st["resident_bytes"]
        if not args.prefill_only:
            time_steps("gaac", cache, nullcontext)
            report(row)
            if args.graphs:
                try:
                    time_graph_steps("gaac_graph", cache)
                except Exception as e:  # noqa: BLE001 - recorded; the eager row stands
                    row["error_gaac_graph"] = f"{type(e).__name__}: {e}"[:300]
        del cache
    except torch.OutOfMemoryError as e:  # the BF16 rows measured above stay in the row
        row["oom_gaac"] = str(e)[:300]
        cache = warm = None
        return row
    finally:
        model.set_attn_implementation("sdpa")
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    w, kb, kg = row["bytes"]["weights"], row["bytes"]["kv_bf16"], row["bytes"]["kv_gaac"]
    row["ideal_gpu_speedup"] = (w + kb) / (w + kg)
    if "prefill_s_bf16" in row:
        row["prefill_overhead"] = row["prefill_s_gaac"] / row["prefill_s_bf16"] - 1
    for base in ("fa2", "cudnn", "static_fa2", "static_cudnn") if not args.prefill_only else ():
        if f"step_gpu_us_{base}" in row:  # absent: that BF16 cache ran out of memory (oom_*)
            row[f"speedup_wall_vs_{base}"] = row[f"step_wall_us_{base}"] / row["step_wall_us_gaac"]
            row[f"speedup_gpu_vs_{base}"] = row[f"step_gpu_us_{base}"] / row["step_gpu_us_gaac"]
    if "step_wall_us_gaac_graph" in row:
        row["gaac_graph_wall_over_gpu"] = row["step_wall_us_gaac_graph"] / row["step_gpu_us_gaac_graph"]
        for base in ("static_stock_graph", "static_cudnn", "static_fa2"):
            if f"step_wall_us_{base}" in row:
                row[f"speedup_graph_wall_vs_{base}"] = row[f"step_wall_us_{base}"] / row["step_wall_us_gaac_graph"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="eval/results/e2e_h200.json")
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 65536])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prof-steps", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=400)
    p.add_argument("--prefill-only", action="store_true", help="time the prefills only (no decode steps)")
    p.add_argument("--prefill-reps", type=int, default=3, help="prefills timed per cache kind (median reported)")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prompt tokens per prefill forward (0: whole prompt up to 2^18 batch tokens, else chunks)")
    p.add_argument("--skip-dynamic", action="store_true",
                   help="leave out the DynamicCache rows (copies the history each step; slow at B x S >= 512K)")
    p.add_argument("--fused", default="true", choices=("true", "false", "auto"),
                   help="GAACCache(fused=...) for the GAAC rows (lab/results/superseded/e2e_h200_auto.json ran with auto)")
    p.add_argument("--format-version", type=int, default=None, choices=(2, 3, 4),
                   help="GAACCache(format_version=...); default: the cache's own choice (v3 on Hopper with the cuda extra)")
    p.add_argument("--skip-stock-graph", action="store_true",
                   help="with --graphs, leave out transformers' StaticCache replayed from a graph (its own prefill)")
    p.add_argument("--graphs", action="store_true",
                   help="also time CUDA-graph replays of the decode step (GAAC graph mode; stock StaticCache)")
    p.add_argument("--compile-ops", nargs="?", const="ops", choices=("ops", "fused", "fused-combo", "fused-pdl"),
                   default=None,
                   help="the model's RMSNorm, rotary embedding and SiLU-gate torch.compile'd for every cache kind "
                        "(eval/compiled_ops.py): fewer kernels per step, the caches untouched; 'fused' also stacks the "
                        "q/k/v and gate/up projections and fuses the q/k norms and the residual adds; 'fused-combo' "
                        "also lets inductor launch independent kernels together (combo_kernels); 'fused-pdl' launches "
                        "the compiled kernels with programmatic dependent launch (triton.enable_pdl)")
    p.add_argument("--kernel-table", action="store_true",
                   help="record each profiled kernel's time per step under row['kernels'][cache kind], and the idle "
                        "device time before each kernel under row['kernel_gaps'][cache kind] (harness.kernel_gaps)")
    p.add_argument("--tiny", action="store_true", help="2-layer model on the CPU: checks the script, measures nothing")
    args = p.parse_args(argv)
    args.fused = {"true": True, "false": False, "auto": "auto"}[args.fused]
    if not torch.cuda.is_available() and not args.tiny:
        sys.exit("bench_e2e needs a CUDA GPU (or --tiny for a CPU smoke run)")
    import transformers
    import triton

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.time()
    model = build_model(dev, tiny=args.tiny)
    table = calibrate_random(model, dev, tokens=512 if args.tiny else 4096)
    out = {
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (--tiny smoke run)",
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "command": "python " + " ".join(sys.argv),
        # lab switch: GAAC's own decode kernels built and launched for programmatic dependent launch
        "gaac_pdl": os.environ.get("GAAC_PDL", "0") == "1",
        "model": "Qwen3-8B shape, random init, bf16",
        "calibration": {"table_format_version": 2, "block_size": table.geometry.block_size,
                        "cache_format_version": args.format_version or "default"},
        "static_rows": "static_fa2 / static_cudnn: transformers StaticCache (preallocated, written in place) read by "
                       "SDPA on the filled prefix only (no mask, enable_gqa) under the pinned backend; see "
                       "inplace_static_sdpa (HF 5.17's own StaticCache decode passes a full-length mask: flash "
                       "refuses it and repeat_kv copies K/V 4x)",
        "rows": [], "skipped": [],
    }
    cases = [(b, s) for s in args.contexts for b in args.batches]
    with ExitStack() as stack:
        if args.compile_ops:
            from compiled_ops import compiled_qwen3_ops

            out["compiled_ops"] = stack.enter_context(compiled_qwen3_ops(
                model, fuse=args.compile_ops.startswith("fused"), combo=args.compile_ops == "fused-combo",
                pdl=args.compile_ops == "fused-pdl"))
        run_cases(model, table, cases, dev, args, out, t_start)
    print_table(out, args)


def run_cases(model, table, cases, dev, args, out, t_start):
    for B, S in cases:
        if time.time() - t_start > args.budget_s:
            out["skipped"].append({"batch": B, "context": S, "why": "time budget"})
            continue
        try:
            # a case in progress is in the file as a row marked partial (a call cut short keeps what it measured)
            row = run_case(model, table, B, S, dev, args, progress=lambda r: harness.write_result(
                args.out, out | {"rows": out["rows"] + [dict(r, partial=True)]}))
        except torch.OutOfMemoryError as e:  # report, keep going
            row = {"batch": B, "context": S, "error": f"OOM: {e}"[:300]}
            torch.cuda.empty_cache()
        out["rows"].append(row)
        out["sdpa_calls"] = dict(STATIC_CALLS)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if not isinstance(v, dict)}), flush=True)
        harness.write_result(args.out, out)


def print_table(out, args):
    print(f"{'B':>2} {'ctx':>6} {'wall fa2':>9} {'cudnn':>8} {'st-cudnn':>8} {'gaac':>8} {'gpu fa2':>8} {'cudnn':>8} {'st-cudnn':>8} {'gaac':>8} {'ideal':>6} {'prefill+':>8}")
    for r in out["rows"]:
        if "error" in r:
            print(r["batch"], r["context"], r["error"][:80])
            continue
        if args.prefill_only:
            print(f"{r['batch']:>2} {r['context']:>6} prefill bf16 {r['prefill_s_bf16']:.4f} s  gaac {r['prefill_s_gaac']:.4f} s"
                  f"  overhead {100*r['prefill_overhead']:.2f}%  samples {r['prefill_s_bf16_samples']} / {r['prefill_s_gaac_samples']}")
            continue
        miss = "skip" if "skipped_dynamic" in r else "OOM"
        ms = lambda k, w=7, d=2: f"{r[k] / 1e3:>{w}.{d}f}m" if k in r else f"{miss:>{w + 1}}"  # noqa: E731
        over = f"{100 * r['prefill_overhead']:>7.1f}%" if "prefill_overhead" in r else f"{'-':>8}"
        print(f"{r['batch']:>2} {r['context']:>6} {ms('step_wall_us_fa2', 8, 1)} {ms('step_wall_us_cudnn', 7, 1)} "
              f"{ms('step_wall_us_static_cudnn', 7, 1)} {ms('step_wall_us_gaac', 7, 1)} "
              f"{ms('step_gpu_us_fa2')} {ms('step_gpu_us_cudnn')} {ms('step_gpu_us_static_cudnn')} "
              f"{ms('step_gpu_us_gaac')} {r.get('ideal_gpu_speedup', float('nan')):>6.3f} {over}")


if __name__ == "__main__":
    main()
