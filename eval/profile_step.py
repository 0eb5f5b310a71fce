"""Where the host time of one GAAC decode step goes (vs DynamicCache + SDPA), Qwen3-8B shape.

    python eval/profile_step.py --out eval/results/profile_step_h200.json [--context 8192] [--batch 1]
    python eval/profile_step.py --tiny --out /tmp/p.json      # CPU smoke run: checks the script only

(eval/results/e2e_h200_static.json was made by this script's former ``--bench-e2e`` mode, which ran
eval/bench_e2e.py with in-place StaticCache rows; that logic now lives in bench_e2e.inplace_static_sdpa.)

Same model and calibration as eval/bench_e2e.py (random-init Qwen3-8B shape, bf16, 36 layers). The
context is prefilled into a cache, 3 decode steps warm up, then for GAACCache (GAAC attention, fused
Triton decode kernel) and for DynamicCache + SDPA (flash backend):

  * wall time per step (host-synchronised) and the host's enqueue time (step returned, before the sync);
  * low-overhead perf_counter timers wrapped around the functions of the decode path (update, append,
    the attention function, _fused_decode, paged_kv, gaac_decode_attention, _launch, the two Triton
    launches; Qwen3Attention / MLP / decoder-layer forwards for scale), per call and per step;
  * cProfile of ``--prof-steps`` steps (top 30 by tottime and cumtime, as text);
  * torch.profiler (CPU + CUDA) of ``--torch-prof-steps`` steps: top CPU ops by self CPU time, every
    sync-like event (cuda*Synchronize, Memcpy, item, _local_scalar_dense, nonzero, ...), kernel launches
    and GPU busy time per step;
  * torch.cuda.set_sync_debug_mode("warn") over 2 steps, with the Python stack of every synchronizing
    torch op;
  * bare-call loops on one layer (GAAC): paged_kv(), gaac_decode_attention with a prepared view,
    the two Triton launches replayed alone, SDPA on the same shape, and two trivial torch ops to
    calibrate the host's per-op cost.
Steps grow the context by one token each (no crop), like bench_e2e; the step on which a block fills
(encode + pool append) is reported separately.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import defaultdict
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_e2e import _sync, build_model, calibrate_random  # noqa: E402
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402

SYNC_RE = re.compile(r"synchron|memcpy|item|local_scalar|nonzero|tolist|is_nonzero|eventquery|eventsynchron", re.I)
LAUNCH_RE = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cuLaunchKernelEx|cudaLaunchKernelExC)$")


# ---------------------------------------------------------------------------------------------
# timers wrapped around functions (a few hundred ns each)
# ---------------------------------------------------------------------------------------------
class Timers:
    def __init__(self):
        self.t = defaultdict(float)
        self.n = defaultdict(int)
        self.on = False
        self._undo = []

    def wrap(self, name, fn):
        pc = time.perf_counter

        def w(*a, **k):
            if not self.on:
                return fn(*a, **k)
            t0 = pc()
            try:
                return fn(*a, **k)
            finally:
                self.t[name] += pc() - t0
                self.n[name] += 1
        w.__wrapped__ = fn
        return w

    def patch(self, owner, attr, name=None, instance=False):
        """Replace owner.attr by a timed wrapper (instance=True: set as an instance attribute)."""
        orig = getattr(owner, attr)
        own = attr in vars(owner)
        raw = vars(owner).get(attr)
        setattr(owner, attr, self.wrap(name or attr, orig))
        if instance or not own:
            self._undo.append(lambda: delattr(owner, attr))
        else:
            self._undo.append(lambda: setattr(owner, attr, raw))

    def patch_map(self, mapping, key, name):
        orig = mapping[key]
        mapping[key] = self.wrap(name, orig)
        self._undo.append(lambda: mapping.__setitem__(key, orig))

    def restore(self):
        while self._undo:
            self._undo.pop()()

    def reset(self):
        self.t.clear()
        self.n.clear()

    def report(self, steps):
        return {k: {"calls_per_step": self.n[k] / steps, "us_per_call": 1e6 * self.t[k] / max(self.n[k], 1),
                    "us_per_step": 1e6 * self.t[k] / steps} for k in sorted(self.t, key=lambda k: -self.t[k])}


def install_timers(timers, gaac: bool):
    from transformers.cache_utils import DynamicLayer
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.qwen3 import modeling_qwen3 as mq

    timers.patch(mq.Qwen3DecoderLayer, "forward", "Qwen3DecoderLayer.forward")
    timers.patch(mq.Qwen3Attention, "forward", "Qwen3Attention.forward")
    timers.patch(mq.Qwen3MLP, "forward", "Qwen3MLP.forward")
    if not gaac:
        timers.patch(DynamicLayer, "update", "DynamicLayer.update")
        timers.patch_map(AttentionInterface._global_mapping, "sdpa", "sdpa_attention_forward")
        return
    import gaac_hf.cache.attention as ga
    from gaac_hf.cache import GAACLayer
    from gaac_hf.cache.pool import _BlockPool

    timers.patch(GAACLayer, "update", "GAACLayer.update")
    timers.patch(GAACLayer, "append", "GAACLayer.append")
    timers.patch(GAACLayer, "paged_kv", "GAACLayer.paged_kv")
    timers.patch(GAACLayer, "full_kv", "GAACLayer.full_kv (decode-then-SDPA path)")
    timers.patch(GAACLayer, "_full", "GAACLayer._full")
    timers.patch(ga, "_sdpa", "attention._sdpa (lookup)")
    import transformers.integrations.sdpa_attention as tsa
    timers.patch(tsa, "sdpa_attention_forward", "sdpa_attention_forward")
    timers.patch(torch.nn.functional, "scaled_dot_product_attention", "F.scaled_dot_product_attention")
    timers.patch(ga, "_no_cudnn", "attention._no_cudnn (ctx build)")
    try:
        import gaac_hf.kernels.decode as kd
        timers.patch(kd, "decode_tables_triton", "decode_tables_triton")
        timers.patch(kd, "_check_pool", "decode._check_pool")
        timers.patch(kd._table_decode_kernel, "run", "triton launch: _table_decode_kernel", instance=True)
    except ImportError:
        pass
    timers.patch(_BlockPool, "append", "_BlockPool.append (block fill)")
    timers.patch_map(AttentionInterface._global_mapping, "gaac", "gaac_attention_forward")
    timers.patch(ga, "_fused_decode", "_fused_decode")
    kern = ga._fused_kernel()
    if kern:
        timers.patch(kern, "gaac_decode_attention", "gaac_decode_attention")
        timers.patch(kern, "_launch", "_launch")
        timers.patch(kern._attn_split_kernel, "run", "triton launch: _attn_split_kernel", instance=True)
        timers.patch(kern._merge_kernel, "run", "triton launch: _merge_kernel", instance=True)


# ---------------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------------
def wall_and_enqueue(step, n):
    wall, enq = [], []
    _sync()
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        _sync()
        t2 = time.perf_counter()
        wall.append((t2 - t0) * 1e6)
        enq.append((t1 - t0) * 1e6)
    return {"wall_us_median": statistics.median(wall), "enqueue_us_median": statistics.median(enq),
            "wall_us": [round(x, 1) for x in wall], "enqueue_us": [round(x, 1) for x in enq]}


def cprofile_steps(step, n):
    pr = cProfile.Profile()
    _sync()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(n):
        step()
    _sync()
    pr.disable()
    wall = (time.perf_counter() - t0) / n * 1e6
    st = pstats.Stats(pr)
    st.strip_dirs()
    out = {"steps": n, "wall_us_per_step_under_cprofile": wall}
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        st.stream = s
        st.sort_stats(key).print_stats(30)
        out[f"top30_{key}"] = s.getvalue()
    rows = []
    for (f, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"func": f"{f}:{line}({fn})", "calls_per_step": nc / n, "tottime_us_per_step": 1e6 * tt / n,
                     "cumtime_us_per_step": 1e6 * ct / n})
    rows.sort(key=lambda r: -r["tottime_us_per_step"])
    out["top40_tottime_structured"] = rows[:40]
    return out


def torch_profile(step, n, dev, trace_path=None):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    _sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        _sync()
    wall = (time.perf_counter() - t0) / n * 1e6
    ka = prof.key_averages()
    out = {"steps": n, "wall_us_per_step_under_profiler": wall,
           "table_self_cpu": ka.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70)}
    gpu = 0.0
    syncs, launches = [], {}
    for e in ka:
        gpu += getattr(e, "self_device_time_total", 0.0) or 0.0
        if SYNC_RE.search(e.key):
            syncs.append({"name": e.key, "calls_per_step": e.count / n, "self_cpu_us_per_step": e.self_cpu_time_total / n,
                          "cpu_us_per_call": e.cpu_time_total / max(e.count, 1)})
        if LAUNCH_RE.match(e.key):
            launches[e.key] = {"calls_per_step": e.count / n, "self_cpu_us_per_call": e.self_cpu_time_total / max(e.count, 1)}
    syncs.sort(key=lambda r: -r["self_cpu_us_per_step"])
    out.update(gpu_busy_us_per_step=gpu / n, sync_like_events=syncs, launches=launches)
    if trace_path:
        prof.export_chrome_trace(trace_path)
    return out


def sync_debug(step, n, dev):
    """Python stacks of synchronizing torch ops (torch.cuda.set_sync_debug_mode('warn'))."""
    if dev.type != "cuda":
        return {"skipped": "cpu"}
    hits = defaultdict(int)

    def show(message, category, filename, lineno, file=None, line=None):
        stack = traceback.format_stack(limit=11)[:-1]
        hits[(str(message)[:160], "".join(stack))] += 1

    _sync()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(n):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync()
    return {"steps": n, "sync_ops": [{"message": m, "count_per_step": c / n, "stack": s} for (m, s), c in hits.items()]}


def host_loop_us(fn, n):
    """Host time per call of fn (no sync inside the loop), and wall per call including the final sync."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    _sync()
    t2 = time.perf_counter()
    return {"host_us_per_call": (t1 - t0) / n * 1e6, "wall_us_per_call_incl_sync": (t2 - t0) / n * 1e6}


def gpu_us_per_call(fn, n, dev):
    if dev.type != "cuda":
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        _sync()
    return sum(e.self_device_time_total for e in prof.key_averages()) / n


def bare_calls(cache, model, dev, iters):
    """Loops of the pieces of one layer's fused decode call (layer 0 of the GAAC cache)."""
    import torch.nn.functional as F

    import gaac_hf.cache.attention as ga
    from gaac_hf.cache import GAACLayer

    out = {}
    kern = ga._fused_kernel()
    layer = next(x for x in cache.layers if isinstance(x, GAACLayer))
    cfg = model.config
    B = layer.tails[0].shape[0]
    q = torch.randn(B, cfg.num_attention_heads, cfg.head_dim, dtype=torch.bfloat16, device=dev)
    scale = cfg.head_dim ** -0.5
    out["trivial torch.full((B,), int32)"] = host_loop_us(lambda: torch.full((B,), 7, dtype=torch.int32, device=dev), iters)
    out["trivial torch.empty(B,32,8,128 f32)"] = host_loop_us(lambda: torch.empty(B, 32, 8, 128, dtype=torch.float32, device=dev), iters)
    out["layer.paged_kv()"] = host_loop_us(layer.paged_kv, iters)
    if dev.type != "cuda" or not kern:
        return out
    view = layer.paged_kv()
    f_prepared = lambda: kern.gaac_decode_attention(q, view, scale=scale)  # noqa: E731
    f_full = lambda: kern.gaac_decode_attention(q, layer.paged_kv(), scale=scale)  # noqa: E731
    out["gaac_decode_attention(prepared view)"] = host_loop_us(f_prepared, iters)
    out["gaac_decode_attention(prepared view)"]["gpu_us_per_call"] = gpu_us_per_call(f_prepared, 20, dev)
    out["gaac_decode_attention(layer.paged_kv())"] = host_loop_us(f_full, iters)
    # capture the exact Triton launch arguments, then replay each launch alone
    captured = {}
    for name in ("_attn_split_kernel", "_merge_kernel"):
        jf = getattr(kern, name)
        orig = jf.run

        def cap(*a, _n=name, _o=orig, **k):
            captured[_n] = (a, k)
            return _o(*a, **k)
        jf.run = cap
    try:
        f_prepared()
    finally:
        for name in ("_attn_split_kernel", "_merge_kernel"):
            del getattr(kern, name).run
    for name, (a, k) in captured.items():
        run = getattr(kern, name).run
        out[f"triton launch replay: {name}"] = host_loop_us(lambda r=run, a=a, k=k: r(*a, **k), iters)
    out["last_launch"] = {k: v for k, v in kern.LAST_LAUNCH.items()}
    # SDPA decode on the same shape (BF16 contiguous K/V of this length), flash backend
    from torch.nn.attention import SDPBackend, sdpa_kernel

    S = layer.get_seq_length()
    H = layer.tails[0].shape[1]
    k = torch.randn(B, H, S, cfg.head_dim, dtype=torch.bfloat16, device=dev)
    v = torch.randn_like(k)
    q4 = q.unsqueeze(2)

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
    out["sdpa flash (same shape, incl. sdpa_kernel ctx)"] = host_loop_us(sdpa, iters)
    out["sdpa flash (same shape, incl. sdpa_kernel ctx)"]["gpu_us_per_call"] = gpu_us_per_call(sdpa, 20, dev)
    del k, v
    return out


# ---------------------------------------------------------------------------------------------
def profile_cache(name, model, cache, ids, nxt, S, B, dev, ctx, args, gaac: bool, prefill_ctx=None):
    res = {}
    pos = torch.full((B, 1), S, device=dev, dtype=torch.long)

    def step():
        with torch.no_grad(), ctx():
            model(nxt, **cache_kwargs(model, cache), position_ids=pos, logits_to_keep=1)
        pos.add_(1)

    _sync()
    t0 = time.perf_counter()
    with torch.no_grad(), (prefill_ctx or ctx)():
        model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
    _sync()
    res["prefill_s"] = time.perf_counter() - t0
    for _ in range(3):
        step()
    res["seq_len_after_warmup"] = cache.get_seq_length()
    res["wall"] = wall_and_enqueue(step, args.steps)
    timers = Timers()
    install_timers(timers, gaac)
    try:
        timers.on = True
        w = wall_and_enqueue(step, args.timer_steps)
        timers.on = False
        res["timers"] = {"steps": args.timer_steps, "wall_us_median_with_timers": w["wall_us_median"],
                         "per_function": timers.report(args.timer_steps)}
    finally:
        timers.restore()
    res["cprofile"] = cprofile_steps(step, args.prof_steps)
    trace = os.path.join(args.trace_dir, f"trace_{name}.json") if args.trace_dir else None
    res["torch_profiler"] = torch_profile(step, args.torch_prof_steps, dev, trace)
    res["sync_debug"] = sync_debug(step, 2, dev)

    def step_crop():  # the first e2e run's step (lab/results/e2e_h200_9edc7cc_superseded.json): append one token, crop it
        step()
        cache.crop(-1)
        pos.sub_(1)
    res["wall_with_crop"] = wall_and_enqueue(step_crop, args.crop_steps)
    if gaac:
        g = next(x for x in cache.layers if hasattr(x, "paged_kv"))
        res["gaac_state"] = {"num_blocks": g.num_blocks, "tail_len": g.tail_len,
                             "table_capacity": g.tables[0].shape[-1], "slot_rows": g.pools[0].slots.shape[0]}
        res["bare_calls_layer0"] = bare_calls(cache, model, dev, args.kernel_iters)
        # run on until a block fills: the fill step encodes and appends (report it apart)
        t = g.geometry.block_size
        fill = []
        for _ in range(t + 1):
            before = g.num_blocks
            _sync()
            t0 = time.perf_counter()
            step()
            _sync()
            dt = (time.perf_counter() - t0) * 1e6
            if g.num_blocks != before:
                fill.append(dt)
                break
        res["block_fill_step_wall_us"] = fill
    res["seq_len_end"] = cache.get_seq_length()
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="eval/results/profile_step_h200.json")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="wall-time steps")
    p.add_argument("--timer-steps", type=int, default=10)
    p.add_argument("--prof-steps", type=int, default=10, help="cProfile steps")
    p.add_argument("--torch-prof-steps", type=int, default=4)
    p.add_argument("--kernel-iters", type=int, default=200)
    p.add_argument("--crop-steps", type=int, default=8, help="steps of append + crop(-1), as in the first e2e run")
    p.add_argument("--trace-dir", default=None, help="write torch.profiler chrome traces here")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--fused", default="true", choices=("true", "auto"),
                   help="GAACCache(fused=...): 'auto' profiles the decode-then-SDPA steps (context >= FUSED_MAX_TOKENS)")
    p.add_argument("--tiny", action="store_true", help="2-layer model on the CPU: checks the script, measures nothing")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        sys.exit("profile_step needs a CUDA GPU (or --tiny for a CPU smoke run)")
    import transformers
    from transformers import DynamicCache

    import gaac_hf

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    model = build_model(dev, tiny=args.tiny)
    table = calibrate_random(model, dev, tokens=512 if args.tiny else 4096)
    B, S = args.batch, args.context
    g = torch.Generator(device="cpu").manual_seed(S + B)
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=g).to(dev)
    nxt = torch.randint(0, model.config.vocab_size, (B, 1), generator=g).to(dev)
    out = {
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (--tiny smoke run)",
        "host_cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "triton": tv, "transformers": transformers.__version__,
                     "python": platform.python_version(), "gaac_hf_file": gaac_hf.__file__},
        "command": "python " + " ".join(sys.argv),
        "model": ("tiny 2-layer" if args.tiny else "Qwen3-8B shape (36 layers, 32 q / 8 kv heads, d=128)") + ", random init, bf16",
        "shapes": {"batch": B, "context": S, "layers": model.config.num_hidden_layers,
                   "q_heads": model.config.num_attention_heads, "kv_heads": model.config.num_key_value_heads,
                   "head_dim": model.config.head_dim, "block_size": table.geometry.block_size,
                   "escape_limit": table.geometry.escape_limit},
        "note": "timers = perf_counter wrappers (host time incl. any sync inside); cProfile inflates Python time",
    }
    if dev.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        flash = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # noqa: E731
    else:
        flash = nullcontext
    if not args.skip_baseline:
        model.set_attn_implementation("sdpa")
        cache = DynamicCache(config=model.config)
        out["dynamic_sdpa_flash"] = profile_cache("dynamic_sdpa", model, cache, ids, nxt, S, B, dev, flash, args, gaac=False)
        del cache
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    gaac_hf.register()
    model.set_attn_implementation("gaac")
    try:
        cache = gaac_hf.GAACCache(model.config, calibration=table, fused=True if args.fused == "true" else "auto")
        # prefill under the same pinned SDPA backend as the baseline (GAAC's reference prefill path);
        # the decode steps run without it (fused kernel)
        res = profile_cache("gaac", model, cache, ids, nxt, S, B, dev, nullcontext, args, gaac=True, prefill_ctx=flash)
        out["gaac"] = res
        del cache
    finally:
        model.set_attn_implementation("sdpa")
    harness.write_result(args.out, out)
    summary(out)


def summary(out):
    L = out["shapes"]["layers"]
    print(f"== {out['gpu']} | host {out['host_cpu']} | {out['shapes']}")
    for tag in ("dynamic_sdpa_flash", "gaac"):
        r = out.get(tag)
        if not r:
            continue
        w = r["wall"]
        tp = r["torch_profiler"]
        print(f"-- {tag}: wall {w['wall_us_median']/1e3:.2f} ms/step (with crop {r['wall_with_crop']['wall_us_median']/1e3:.2f}), "
              f"enqueue {w['enqueue_us_median']/1e3:.2f} ms, "
              f"GPU busy {tp['gpu_busy_us_per_step']/1e3:.2f} ms, launches {tp['launches']}")
        for k, v in list(r["timers"]["per_function"].items())[:14]:
            print(f"   {k:<40} {v['calls_per_step']:>6.1f}/step {v['us_per_call']:>9.1f} us/call {v['us_per_step']/1e3:>8.2f} ms/step "
                  f"({v['us_per_step']/L:>7.1f} us/layer)")
        for s in tp["sync_like_events"][:8]:
            print(f"   sync-like: {s['name']:<40} {s['calls_per_step']:>6.1f}/step {s['self_cpu_us_per_step']:>9.1f} us/step")
        sd = r["sync_debug"]
        for s in sd.get("sync_ops", [])[:5]:
            print(f"   SYNC OP x{s['count_per_step']}/step: {s['message'][:100]}\n{s['stack'][-900:]}")
        if "bare_calls_layer0" in r:
            for k, v in r["bare_calls_layer0"].items():
                print(f"   bare {k:<50} {v}")
            print(f"   block-fill step wall us: {r.get('block_fill_step_wall_us')}")


if __name__ == "__main__":
    main()
