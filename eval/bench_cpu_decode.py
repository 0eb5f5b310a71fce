"""CPU decode speed and memory: DynamicCache + SDPA vs GAACCache (format v3, tiled C++ attention) on SmolLM2.

For each context length and each cache, one fresh process loads SmolLM2-135M in BF16 with
``torch.set_num_threads(threads)``, prefills ``context`` tokens of held-out WikiText-2 test text
(repeated if short) in one forward with ``logits_to_keep=1`` (what ``generate()`` passes: no
[context, vocab] logits), then runs ``steps`` greedy decode steps (``model(next_token, cache)``), timing
each. GAAC runs also time their stages: the tiled attention calls, the cache appends (tail writes, and
the encoder when a block completes) during decode, and the appends (encoder) during the prefill. The
reported ``s_per_token`` come from the GAAC process afterwards: a DynamicCache filled with the GAAC
cache's decoded K/V (the same bits) and the GAAC cache take ``steps`` decode steps alternately, so both
see the same machine load (the 2-core development machine is shared); the separate-process step times
are kept as well. The reported ``prefill_s`` come likewise from another process that alternates whole
prefills of the two caches (order dynamic, gaac, gaac, dynamic, ...: ``--prefill-reps`` of each, after a
short warm-up of both): medians, with the fastest (``prefill_s_min``), every time and the 1-minute load
average before each.

Memory (``MEMORY_METHOD`` below, also written into the JSON): a third fresh process, kind ``none``, runs
the same forwards without keeping any K/V (``use_cache=False``), so its peak RSS is the model's and its
activations'. The peak RSS of the cache part of a cache kind is its process's peak RSS (``ru_maxrss``)
minus the ``none`` process's (``cache_peak_rss_mb``): what holding that cache, its temporaries and its
allocator leftovers added to the process at its worst moment. One process's peak RSS is not repeatable
to better than several MB: glibc's heap extent (bytes taken from the OS) differs by up to ~10 MB between
runs of the same code with the same bytes in use (measured: ``lab/NOTES.md``, "CPU peak RSS"), which
is a third of the whole cache part at 1K tokens. So each kind runs in ``--mem-reps`` fresh processes (the
kinds' order rotated between rounds) and the peak RSS is the median of its processes (every process's
value is kept: ``peak_rss_mb_runs``). Beside it, the same difference of glibc's bytes in use
(``mallinfo2``, sampled before and after every attention and MLP module and inside the GAAC encoder's
pack, while its buffer is alive: ``cache_peak_alloc_mb``, repeatable to ~0.1 MB), the heap extent at the
same points (``peak_heap_mb``), and the bytes the cache's own tensors hold after the last step
(``cache_mb``; GAAC: ``stats()["allocated_bytes"]``).

Writes ``eval/results/cpu_decode_smollm2.json`` (``rows``: ``context``, ``s_per_token`` {dynamic, gaac}
(median step; ``s_per_token_min`` the fastest; the 1-minute load average after each run is recorded
too), ``prefill_s`` {dynamic, gaac}, ``peak_rss_mb`` {dynamic, gaac, none}, ``cache_peak_rss_mb`` and
``cache_peak_alloc_mb`` {dynamic, gaac}, ``cache_mb`` {dynamic, gaac}, ``gaac_stages`` and ratios) and a
PNG plot beside it.

    python eval/bench_cpu_decode.py [--contexts 1024 4096 16384] [--steps 16] [--threads 2] [--prefill-reps N] [--mem-reps N]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "cpu_decode_smollm2.json"
MEMORY_METHOD = ("mem_reps fresh processes per cache kind and context (kinds' order rotated between rounds), same "
                 "prompt and forwards; peak_rss_mb: the median over a kind's processes of each one's ru_maxrss (every "
                 "value in peak_rss_mb_runs: one process's peak varies by several MB between runs of the same code, "
                 "glibc's heap extent differing while its bytes in use do not); cache_peak_rss_mb[kind] = "
                 "peak_rss_mb[kind] - peak_rss_mb['none'], where kind 'none' runs the same forwards with "
                 "use_cache=False (the model and its activations, no K/V kept); cache_peak_alloc_mb: the same "
                 "difference of glibc mallinfo2 bytes in use (uordblks + hblkhd; medians likewise), sampled "
                 "before/after every self_attn and mlp module and inside GAAC's pack_kv; peak_heap_mb: mallinfo2 "
                 "arena + hblkhd (bytes malloc holds from the OS) at the same points; cache_mb: bytes of the cache's "
                 "tensors after the last step. Prefills use logits_to_keep=1, as generate() does.")


def timed(fn, stages: dict, key: str):
    """``fn`` adding its wall time to ``stages[key]``."""
    def wrap(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stages[key] += time.perf_counter() - t
    return wrap


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]


def alloc_sampler(model) -> dict:
    """Hooks that keep ``peak["bytes"]``: the most bytes glibc had in use at any sample point (before and
    after every self_attn and mlp module of ``model``; callers add their own points with ``peak["sample"]``),
    and ``peak["heap"]``: the most bytes it held from the OS (arenas + mmapped chunks) at those points."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    peak = {"bytes": 0, "heap": 0}

    def sample(*_):
        m = libc.mallinfo2()
        peak["bytes"] = max(peak["bytes"], m.uordblks + m.hblkhd)
        peak["heap"] = max(peak["heap"], m.arena + m.hblkhd)

    for layer in model.model.layers:
        for mod in (layer.self_attn, layer.mlp):
            mod.register_forward_pre_hook(sample)
            mod.register_forward_hook(sample)
    peak["sample"] = sample
    return peak


def _tokens(tok, n: int):
    import torch

    from gaac_hf.data import wikitext

    text = wikitext("test", True)[0]
    ids = tok(text[: 12 * n], return_tensors="pt").input_ids[0]
    while ids.numel() < n:
        ids = torch.cat([ids, ids])
    return ids[:n].unsqueeze(0)


def child(kind: str, context: int, steps: int, threads: int, memory_only: bool = False) -> dict:
    """One configuration in this process (kind dynamic, gaac or none); returns its measurements.
    ``memory_only``: no interleaved decode steps after the measured ones (a repeat for the memory figures)."""
    import torch
    from transformers import DynamicCache

    import gaac_hf
    import gaac_hf.cache.layer as layer_mod
    import gaac_hf.cache.tiled as tiled
    import gaac_hf.kernels.cpu.native as native
    from gaac_hf.models import load_smollm2

    torch.set_num_threads(threads)
    model, tok = load_smollm2()
    gaac_hf.register()
    ids = _tokens(tok, context)
    stages = {"attention": 0.0, "append": 0.0}
    peak = alloc_sampler(model)

    if kind == "gaac":
        model.set_attn_implementation("gaac")
        cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
        tiled.tiled_attention = timed(tiled.tiled_attention, stages, "attention")
        layer_mod.GAACLayer.append = timed(layer_mod.GAACLayer.append, stages, "append")
        pack = native.pack_kv
        native.pack_kv = lambda *a, **k: (peak["sample"](), pack(*a, **k))[1]  # the encoder's buffer is alive here
    else:
        model.set_attn_implementation("sdpa")
        cache = DynamicCache(config=model.config) if kind == "dynamic" else None
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad():
        t = time.perf_counter()
        out = model(ids, **cache_kwargs(model, cache), use_cache=cache is not None, logits_to_keep=1)
        prefill = time.perf_counter() - t
        prefill_stages = dict(stages)
        stages.update(attention=0.0, append=0.0)
        nxt = out.logits[:, -1:].argmax(-1)
        del out
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            out = model(nxt, **cache_kwargs(model, cache), use_cache=cache is not None)
            times.append(time.perf_counter() - t)
            nxt = out.logits[:, -1:].argmax(-1)
            del out
    if kind == "gaac":
        cache_bytes = cache.stats()["allocated_bytes"] + cache.stats()["stock_layer_bytes"]
    elif kind == "dynamic":
        cache_bytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    else:
        cache_bytes = 0
    res = {"prefill_s": prefill, "step_s": times, "s_per_token": statistics.median(times), "s_per_token_min": min(times),
           "loadavg_1min_after": os.getloadavg()[0],
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_after_load_mb": rss0,
           "peak_alloc_mb": peak["bytes"] / 2**20, "peak_heap_mb": peak["heap"] / 2**20, "cache_mb": cache_bytes / 2**20}
    if kind == "gaac" and not memory_only:
        res["stages"] = {"prefill_append_s": prefill_stages["append"],
                         "decode_attention_s_per_step": stages["attention"] / steps,
                         "decode_append_s_per_step": stages["append"] / steps,
                         "ratio": cache.stats()["ratio"]}
        res["interleaved"] = interleaved(model, cache, nxt, steps)
    return res


def interleaved(model, cache, nxt, steps: int) -> dict:
    """Decode steps of DynamicCache + sdpa and GAACCache + gaac alternating in one process, so that both
    see the same machine load (the benchmark machine may be shared). The DynamicCache is filled with
    the GAAC cache's decoded K/V: the same bits (lossless), no second prefill."""
    import torch
    from transformers import DynamicCache

    dyn = DynamicCache(config=model.config)
    for li, layer in enumerate(cache.layers):
        k, v = layer.full_kv()
        dyn.update(k.clone(), v.clone(), li)
    toks = {"dynamic": nxt, "gaac": nxt}
    caches = {"dynamic": (dyn, "sdpa"), "gaac": (cache, "gaac")}
    times = {"dynamic": [], "gaac": []}
    with torch.no_grad():
        for i in range(steps):
            for kind in (("dynamic", "gaac") if i % 2 == 0 else ("gaac", "dynamic")):
                c, impl = caches[kind]
                model.set_attn_implementation(impl)
                t = time.perf_counter()
                out = model(toks[kind], **cache_kwargs(model, c), use_cache=True)
                times[kind].append(time.perf_counter() - t)
                toks[kind] = out.logits[:, -1:].argmax(-1)
    return {"step_s": times, "s_per_token": {k: statistics.median(v) for k, v in times.items()},
            "s_per_token_min": {k: min(v) for k, v in times.items()}, "loadavg_1min_after": os.getloadavg()[0]}


def prefill_child(context: int, reps: int, threads: int) -> dict:
    """Whole prefills of ``context`` tokens, DynamicCache + sdpa and GAACCache + gaac alternating in this
    one process (ABBA order, so a load that drifts costs both the same), after a warm-up of each."""
    import torch
    from transformers import DynamicCache

    import gaac_hf
    from gaac_hf.models import load_smollm2

    torch.set_num_threads(threads)
    model, tok = load_smollm2()
    gaac_hf.register()
    ids = _tokens(tok, context)

    def prefill(kind: str, x) -> float:
        if kind == "gaac":
            model.set_attn_implementation("gaac")
            cache = gaac_hf.GAACCache(model.config, calibration="smollm2-135m", format_version=3)
        else:
            model.set_attn_implementation("sdpa")
            cache = DynamicCache(config=model.config)
        t = time.perf_counter()
        out = model(x, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
        dt = time.perf_counter() - t
        del out, cache
        return dt

    times, load = {"dynamic": [], "gaac": []}, {"dynamic": [], "gaac": []}
    with torch.no_grad():
        for kind in ("dynamic", "gaac"):
            prefill(kind, ids[:, : min(context, 256)])  # warm-up: allocator, library load, first-call paths
        for i in range(reps):
            for kind in (("dynamic", "gaac") if i % 2 == 0 else ("gaac", "dynamic")):
                load[kind].append(os.getloadavg()[0])
                times[kind].append(prefill(kind, ids))
    return {"prefill_s": {k: statistics.median(v) for k, v in times.items()},
            "prefill_s_min": {k: min(v) for k, v in times.items()}, "prefill_times_s": times,
            "loadavg_1min_before": load, "reps": reps}


def _run_child(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def plot(rows: list[dict], path: Path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ctx = [r["context"] for r in rows]
    for kind in ("dynamic", "gaac"):
        ax[0].plot(ctx, [r["s_per_token"][kind] for r in rows], "o-", label=kind)
        ax[1].plot(ctx, [r["cache_peak_rss_mb"][kind] for r in rows], "o-", label=f"{kind}: peak RSS of the cache part")
        ax[1].plot(ctx, [r["cache_mb"][kind] for r in rows], "x--", label=f"{kind}: cache tensors after the steps")
    ax[0].set(xscale="log", xlabel="context (tokens)", ylabel="s per generated token", title="decode step, 2 threads")
    ax[1].set(xscale="log", xlabel="context (tokens)", ylabel="MiB", title="cache memory")
    for a in ax:
        a.legend()
        a.grid(alpha=0.3)
    fig.suptitle("SmolLM2-135M on the CPU: DynamicCache + SDPA vs GAACCache (v3, tiled C++ attention)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-reps", type=int, default=None,
                    help="interleaved prefills of each cache (default 4, 2 from 16K tokens on: whole ABBA rounds)")
    ap.add_argument("--mem-reps", type=int, default=None,
                    help="fresh processes per cache kind for the memory figures (medians; the first also gives the times; "
                         "default 5 below 4K tokens, 3 below 16K, 2 from 16K on: the cache part grows, the noise does not)")
    ap.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", nargs=2, metavar=("KIND", "CONTEXT"))
    a = ap.parse_args()
    if a.child:
        kind, context = a.child[0], int(a.child[1])
        res = (prefill_child(context, a.prefill_reps, a.threads) if kind == "prefill"
               else child(kind, context, a.steps, a.threads, a.memory_only))
        print("RESULT " + json.dumps(res))
        return
    rows, load0 = [], os.getloadavg()[0]
    # the checkout as the run starts: the results file is rewritten after each row, and that rewrite
    # must not mark the later rows' provenance dirty
    commit, dirty = harness.git_state()
    if commit and not os.environ.get("GAAC_COMMIT"):
        os.environ["GAAC_COMMIT"], os.environ["GAAC_DIRTY"] = commit, "1" if dirty else "0"
    for context in a.contexts:
        got, mem = {}, {"dynamic": [], "gaac": [], "none": []}
        kinds = ("dynamic", "gaac", "none")
        mem_reps = max(a.mem_reps or (5 if context < 4096 else 3 if context < 16384 else 2), 1)
        for r in range(mem_reps):
            for kind in kinds[r % 3:] + kinds[: r % 3]:  # rotated: a drift in the machine's state hits every kind
                args = ["--child", kind, str(context), "--steps", str(a.steps), "--threads", str(a.threads)]
                res = _run_child(args + (["--memory-only"] if r else []))
                got.setdefault(kind, res)
                mem[kind].append({k: res[k] for k in ("peak_rss_mb", "peak_alloc_mb", "peak_heap_mb")})
                print(context, kind, r, {k: v for k, v in res.items() if k not in ("step_s", "interleaved")}, flush=True)
        med = {kind: {k: statistics.median(m[k] for m in runs) for k in runs[0]} for kind, runs in mem.items()}
        reps = a.prefill_reps or (4 if context < 16384 else 2)
        pre = _run_child(["--child", "prefill", str(context), "--prefill-reps", str(reps), "--threads", str(a.threads)])
        print(context, "prefill", pre["prefill_s"], pre["prefill_s_min"], flush=True)
        pair = lambda key: {k: got[k][key] for k in ("dynamic", "gaac")}  # noqa: E731
        over_none = lambda key: {k: med[k][key] - med["none"][key] for k in ("dynamic", "gaac")}  # noqa: E731
        runs = lambda key: {k: [m[key] for m in mem[k]] for k in kinds}  # noqa: E731
        inter = got["gaac"].pop("interleaved")
        rows.append({"context": context, "s_per_token": inter["s_per_token"], "s_per_token_min": inter["s_per_token_min"],
                     "step_s": inter["step_s"], "separate_process_s_per_token": pair("s_per_token"),
                     "separate_process_s_per_token_min": pair("s_per_token_min"), "prefill_s": pre["prefill_s"],
                     "prefill_s_min": pre["prefill_s_min"], "prefill_interleaved": pre,
                     "separate_process_prefill_s": pair("prefill_s"),
                     "peak_rss_mb": {k: med[k]["peak_rss_mb"] for k in kinds}, "peak_rss_mb_runs": runs("peak_rss_mb"),
                     "cache_peak_rss_mb": over_none("peak_rss_mb"), "cache_peak_alloc_mb": over_none("peak_alloc_mb"),
                     "peak_alloc_mb": {k: med[k]["peak_alloc_mb"] for k in kinds}, "peak_alloc_mb_runs": runs("peak_alloc_mb"),
                     "peak_heap_mb": {k: med[k]["peak_heap_mb"] for k in kinds}, "peak_heap_mb_runs": runs("peak_heap_mb"),
                     "mem_reps": mem_reps,
                     "rss_after_load_mb": pair("rss_after_load_mb"),
                     "cache_mb": pair("cache_mb"), "loadavg_1min_after": pair("loadavg_1min_after") | {"interleaved": inter["loadavg_1min_after"]},
                     "gaac_stages": got["gaac"]["stages"],
                     "decode_vs_dynamic": inter["s_per_token"]["gaac"] / inter["s_per_token"]["dynamic"],
                     "decode_min_vs_dynamic_min": inter["s_per_token_min"]["gaac"] / inter["s_per_token_min"]["dynamic"],
                     "prefill_vs_dynamic": pre["prefill_s"]["gaac"] / pre["prefill_s"]["dynamic"],
                     "prefill_min_vs_dynamic_min": pre["prefill_s_min"]["gaac"] / pre["prefill_s_min"]["dynamic"],
                     "cache_vs_dynamic": got["gaac"]["cache_mb"] / got["dynamic"]["cache_mb"],
                     "cache_peak_rss_vs_dynamic": ((med["gaac"]["peak_rss_mb"] - med["none"]["peak_rss_mb"])
                                                   / (med["dynamic"]["peak_rss_mb"] - med["none"]["peak_rss_mb"]))})
        out = Path(a.out)
        harness.write_result(out, {"rows": rows, "threads": a.threads, "steps": a.steps, "model": "SmolLM2-135M-Instruct (bf16)",
                                   "gaac": "GAACCache(format_version=3, calibration='smollm2-135m'), gaac attention (tiled C++)",
                                   "dynamic": "DynamicCache + sdpa", "memory_method": MEMORY_METHOD,
                                   "loadavg_1min_start": load0})
    plot(rows, Path(a.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
