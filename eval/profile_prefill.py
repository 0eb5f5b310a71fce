"""Where the prefill time of GAACCache goes: torch.profiler over one 32K prefill, DynamicCache vs GAACCache.

    python eval/profile_prefill.py --context 32768 --out eval/results/profile_prefill_h200.json

Random-init Qwen3-8B shape (eval/bench_e2e.py's model and calibration), SDPA pinned to the flash
backend for both. Reports wall time, GPU busy time, and the top operators by self CUDA time and by
self CPU time for each cache, plus the operators whose CUDA time differs most between the two.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_e2e as E  # noqa: E402
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
from gaac_hf.models import cache_kwargs  # noqa: E402


def profile_prefill(model, ids, make_cache):
    from torch.profiler import ProfilerActivity, profile

    model(ids, **cache_kwargs(model, make_cache()), logits_to_keep=1)  # warm-up (compiles, allocator)
    E._sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        with torch.no_grad():
            model(ids, **cache_kwargs(model, make_cache()), logits_to_keep=1)
        E._sync()
        wall = time.perf_counter() - t0
    ka = prof.key_averages()
    ops = {e.key: dict(cuda_us=e.self_device_time_total, cpu_us=e.self_cpu_time_total, calls=e.count) for e in ka}
    return dict(wall_s=wall, gpu_busy_us=sum(v["cuda_us"] for v in ops.values()),
                cpu_self_us=sum(v["cpu_us"] for v in ops.values()), ops=ops)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", default="eval/results/profile_prefill_h200.json")
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    import gaac_hf
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import DynamicCache

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = E.build_model(dev, tiny=args.tiny)
    table = E.calibrate_random(model, dev, tokens=512 if args.tiny else 4096)
    g = torch.Generator().manual_seed(0)
    S = 300 if args.tiny else args.context
    ids = torch.randint(0, model.config.vocab_size, (args.batch, S), generator=g).to(dev)
    res = {}
    ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if dev.type == "cuda" else torch.no_grad()
    with torch.no_grad(), ctx:
        model.set_attn_implementation("sdpa")
        res["dynamic"] = profile_prefill(model, ids, lambda: DynamicCache(config=model.config))
        gaac_hf.register()
        model.set_attn_implementation("gaac")
        res["gaac"] = profile_prefill(model, ids, lambda: gaac_hf.GAACCache(model.config, calibration=table))
        model.set_attn_implementation("sdpa")
    out = {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "command": "python " + " ".join(sys.argv),
           "batch": args.batch, "context": S, "torch": torch.__version__}
    for k, r in res.items():
        top_cuda = sorted(r["ops"].items(), key=lambda kv: -kv[1]["cuda_us"])[:15]
        top_cpu = sorted(r["ops"].items(), key=lambda kv: -kv[1]["cpu_us"])[:15]
        out[k] = dict(wall_s=r["wall_s"], gpu_busy_us=r["gpu_busy_us"], cpu_self_us=r["cpu_self_us"],
                      top_cuda=top_cuda, top_cpu=top_cpu)
    keys = set(res["dynamic"]["ops"]) | set(res["gaac"]["ops"])
    z = dict(cuda_us=0.0, cpu_us=0.0, calls=0)
    diff = sorted(((k, res["gaac"]["ops"].get(k, z)["cuda_us"] - res["dynamic"]["ops"].get(k, z)["cuda_us"],
                    res["gaac"]["ops"].get(k, z)["cpu_us"] - res["dynamic"]["ops"].get(k, z)["cpu_us"],
                    res["gaac"]["ops"].get(k, z)["calls"] - res["dynamic"]["ops"].get(k, z)["calls"]) for k in keys),
                  key=lambda x: -abs(x[1]))[:25]
    out["diff_gaac_minus_dynamic"] = [dict(op=k, cuda_us=c, cpu_us=u, calls=n) for k, c, u, n in diff]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    harness.write_result(args.out, out)
    for k in ("dynamic", "gaac"):
        print(f"{k:8s} wall {out[k]['wall_s']*1e3:8.1f} ms  gpu busy {out[k]['gpu_busy_us']/1e3:8.1f} ms  cpu self {out[k]['cpu_self_us']/1e3:8.1f} ms")
    print("largest CUDA-time differences (gaac - dynamic):")
    for d in out["diff_gaac_minus_dynamic"][:14]:
        print(f"  {d['cuda_us']/1e3:8.2f} ms cuda {d['cpu_us']/1e3:8.2f} ms cpu {d['calls']:+6d} calls  {d['op'][:80]}")


if __name__ == "__main__":
    main()
