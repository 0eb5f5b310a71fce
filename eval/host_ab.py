"""Interleaved host-time A/B of decode steps in ONE process: DynamicCache + SDPA, GAAC fused, GAAC "auto".

    python eval/host_ab.py --out eval/results/host_ab_h200.json [--context 16384] [--rounds 3]
    python eval/host_ab.py --tiny --out /tmp/ab.json        # CPU smoke run: checks the script only

Why: eval/profile_step.py ran DynamicCache then GAAC "auto" in one process and every torch op of the
"auto" steps (linear, mean, rsqrt, ...) took ~2.2x the host time it took in the DynamicCache steps
(cProfile, ``profile_step_h200_auto16k.json``), while a separate fused=True process showed ~1.1x. That
is either the "auto" path slowing the host for everything after it (allocator, SDPA backend flags,
...) or noise of a shared VM. Here the three modes alternate for ``--rounds`` rounds, each step timed
(wall, host-synchronised), and after every block of steps a calibration loop of small torch ops
(``F.linear`` on a [1, 4096] x [4096, 4096] bf16 weight and ``torch.empty``) measures the host's
per-op cost at that moment. Modes (``--modes``): ``dynamic_sdpa`` (SDPA's default backends: cuDNN on
the H200), ``dynamic_sdpa_flash`` (the step under ``sdpa_kernel(FLASH_ATTENTION)``), ``gaac_fused``,
``gaac_auto`` and ``gaac_auto_nosdpactx`` ("auto" without its cuDNN-off context: SDPA picks its backend
itself; bits may differ, timing only).
Same random-init Qwen3-8B-shape model and calibration as eval/bench_e2e.py.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_e2e import _sync, build_model, calibrate_random  # noqa: E402
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def _calib(dev, n=200):
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        torch.nn.functional.linear(x, w)
    t1 = time.perf_counter()
    for _ in range(n):
        torch.empty(1, 32, 8, 128, device=dev)
    t2 = time.perf_counter()
    _sync()
    return {"linear_host_us": 1e6 * (t1 - t0) / n, "empty_host_us": 1e6 * (t2 - t1) / n}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="eval/results/host_ab_h200.json")
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="timed steps per mode per round")
    p.add_argument("--modes", default="dynamic_sdpa,dynamic_sdpa_flash,gaac_fused,gaac_auto")
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        sys.exit("host_ab needs a CUDA GPU (or --tiny)")
    import transformers
    from transformers import DynamicCache

    import gaac_hf
    import gaac_hf.cache.attention as ga

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(dev, tiny=args.tiny)
    table = calibrate_random(model, dev, tokens=512 if args.tiny else 4096)
    B, S = args.batch, (512 if args.tiny else args.context)
    g = torch.Generator(device="cpu").manual_seed(S + B)
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=g).to(dev)
    nxt = torch.randint(0, model.config.vocab_size, (B, 1), generator=g).to(dev)
    gaac_hf.register()
    modes = {}
    wanted = args.modes.split(",")
    for name, impl, mk in (
        ("dynamic_sdpa", "sdpa", lambda: DynamicCache(config=model.config)),
        ("dynamic_sdpa_flash", "sdpa", lambda: DynamicCache(config=model.config)),
        ("gaac_fused", "gaac", lambda: gaac_hf.GAACCache(model.config, calibration=table, fused=True)),
        ("gaac_auto", "gaac", lambda: gaac_hf.GAACCache(model.config, calibration=table, fused="auto")),
        ("gaac_auto_nosdpactx", "gaac", lambda: gaac_hf.GAACCache(model.config, calibration=table, fused="auto")),
    ):
        if name not in wanted:
            continue
        model.set_attn_implementation(impl)
        cache = mk()
        with torch.no_grad():
            model(ids, **cache_kwargs(model, cache), logits_to_keep=1)
        modes[name] = dict(impl=impl, cache=cache, pos=torch.full((B, 1), S, device=dev, dtype=torch.long))
    orig_ctx = ga._no_cudnn

    def run(name, n):
        m = modes[name]
        model.set_attn_implementation(m["impl"])
        if name == "gaac_auto_nosdpactx":
            ga._no_cudnn = contextlib.nullcontext
        walls = []
        ctx = contextlib.nullcontext
        if name == "dynamic_sdpa_flash" and dev.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # noqa: E731
        try:
            for _ in range(n):
                _sync()
                t0 = time.perf_counter()
                with torch.no_grad(), ctx():
                    model(nxt, **cache_kwargs(model, m["cache"]), position_ids=m["pos"], logits_to_keep=1)
                _sync()
                walls.append(1e6 * (time.perf_counter() - t0))
                m["pos"].add_(1)
        finally:
            ga._no_cudnn = orig_ctx
        return walls

    for name in modes:  # warm-up (first-call compiles)
        run(name, 3)
    log = []
    for r in range(args.rounds):
        for name in modes:
            walls = run(name, args.steps)
            log.append(dict(round=r, mode=name, wall_us=walls, wall_us_median=statistics.median(walls),
                            calib_after=_calib(dev, 20 if args.tiny else 200)))
            print(f"round {r} {name:22s} wall {statistics.median(walls) / 1e3:7.2f} ms  calib {log[-1]['calib_after']}",
                  flush=True)
    summary = {name: {"wall_ms_median_over_rounds": statistics.median(
        [x["wall_us_median"] for x in log if x["mode"] == name]) / 1e3,
        "linear_host_us_after": statistics.median([x["calib_after"]["linear_host_us"] for x in log if x["mode"] == name])}
        for name in modes}
    out = {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (--tiny)",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version()},
           "command": "python " + " ".join(sys.argv), "batch": B, "context": S,
           "model": "Qwen3-8B shape, random init, bf16" if not args.tiny else "tiny", "summary": summary, "log": log}
    harness.write_result(args.out, out)
    for k, v in summary.items():
        print(f"{k:22s} {v}")


if __name__ == "__main__":
    main()
