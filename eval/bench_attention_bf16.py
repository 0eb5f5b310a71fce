"""BF16 decode attention on one GPU: our CUDA C++ kernel vs our Triton kernel, FA2 and cuDNN.

    python eval/bench_attention_bf16.py --out eval/results/attention_bf16_h200.json [--sweep] [--quick]

All four run in the same process on the same K/V (random normal bf16, never zeros; the paged cache
holds the same values in shuffled blocks). Each time is GPU time from CUDA-graph replay: 10 x (L2
flush with a 256 MB write, call) captured in one graph, minus a graph of the 10 flushes, median of
15 replays, divided by 10. ``--sweep`` first times launch configurations of the CUDA kernel (warps,
stages, CTAs per SM, loader) on one case per shape; the grid runs the product's default launch
(``LaunchConfig()``), or each shape's best with ``--use-sweep``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # eval/harness.py
import harness  # noqa: E402

SHAPES, SAME_SHAPE = harness.ATTENTION_SHAPES, harness.SAME_SHAPE
CTX, BATCH = harness.ATTENTION_CONTEXTS, harness.ATTENTION_BATCHES
T = 64


def provenance(argv) -> dict:
    return harness.provenance(shapes=SHAPES, argv=argv) | {"cuda": torch.version.cuda}


timeit_graph = harness.timeit_graph  # GPU microseconds of one call, L2 flushed before each (see the module doc)


class Case:
    def __init__(self, shape, B, S, dev, seed=0):
        from gaac_hf.kernels.cuda.attention import pack_paged_bf16

        hq, hkv, d = SHAPES[shape]
        self.shape, self.B, self.S, self.hq, self.hkv, self.d = shape, B, S, hq, hkv, d
        g = torch.Generator(device=dev).manual_seed(seed)
        self.k = torch.randn(B, hkv, S, d, generator=g, device=dev).to(torch.bfloat16)
        self.v = torch.randn(B, hkv, S, d, generator=g, device=dev).to(torch.bfloat16)
        self.q = torch.randn(B, hq, d, generator=g, device=dev).to(torch.bfloat16)
        lens = [S] * B
        self.pk = pack_paged_bf16(self.k, lens, T)
        self.pv = pack_paged_bf16(self.v, lens, T)
        self.out = torch.empty_like(self.q)
        self.kv_bytes = 2 * B * hkv * S * d * 2

    def contiguous_pages(self):
        """The same cache with its blocks in order (a freshly filled pool), for the shuffle's cost."""
        from gaac_hf.kernels.cuda.attention import pack_paged_bf16

        lens = [self.S] * self.B
        return pack_paged_bf16(self.k, lens, T, shuffle=False), pack_paged_bf16(self.v, lens, T, shuffle=False)

    def cuda(self, config=None, pages=None):
        from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors

        pk, pv = pages or (self.pk, self.pv)
        return lambda: bf16_decode_attention_tensors(
            self.q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"], pk["num_blocks"],
            pk["tail_len"], config=config, out=self.out)

    def triton(self):
        from gaac_hf.format import BlockGeometry
        from gaac_hf.kernels import LaunchConfig, PagedKV, PagedTensor
        from gaac_hf.kernels.triton import attention as A

        geom = BlockGeometry(block_size=T, head_dim=self.d)
        S = A.default_num_splits(self.B, self.hkv, self.pk["max_blocks"], self.q.device)
        pt = [PagedTensor.raw_only(p["raw"], p["table"], p["tail"], geom) for p in (self.pk, self.pv)]
        kv = PagedKV(*pt, self.pk["num_blocks"], self.pk["tail_len"], geom)
        launch = LaunchConfig(num_splits=S, tile_tokens=64)
        return lambda: A.bf16_decode_attention(self.q, kv, out=self.out, launch=launch)

    def sdpa(self, backend):
        return harness.sdpa_decode(backend, self.q, self.k, self.v)


_try = harness.time_and_error


SWEEP = [dict(num_warps=w, num_stages=s, ctas_per_sm=c, loader=ld) for ld in ("cp.async", "bulk") for w in (4, 8)
         for s in (2, 3, 4, 6) for c in (1, 2, 3)]


def sweep(shape, B, S, dev):
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.attention import _smem_bytes

    case = Case(shape, B, S, dev)
    rows = []
    for kw in SWEEP:
        if _smem_bytes(case.d, kw["num_warps"], kw["num_stages"]) * kw["ctas_per_sm"] > 228 * 1024 - 1024 * kw["ctas_per_sm"]:
            continue
        cfg = LaunchConfig(**kw)
        us, _ = _try(f"cuda {kw}", lambda: case.cuda(cfg))
        rows.append(dict(config=kw, us=us))
        print(f"  sweep {shape} B={B} {S}: {kw} -> {us}", flush=True)
    ok = [r for r in rows if r["us"] is not None]
    best = min(ok, key=lambda r: r["us"])["config"] if ok else {}
    return rows, best


SPLIT_SWEEP = {  # (shape, B, S): launch configs x forced split counts (over-decomposition vs one wave)
    ("qwen3-8b", 1, 65536): ([dict(num_warps=4, num_stages=3, ctas_per_sm=1), dict(num_warps=8, num_stages=3, ctas_per_sm=1),
                              dict(num_warps=4, num_stages=3, ctas_per_sm=2), dict(num_warps=4, num_stages=2, ctas_per_sm=3)],
                             [16, 24, 32, 48, 64, 96, 128]),
    ("qwen3-8b", 16, 32768): ([dict(num_warps=8, num_stages=3, ctas_per_sm=1), dict(num_warps=4, num_stages=3, ctas_per_sm=2)],
                              [1, 2, 3, 4, 8]),
    ("gemma3", 1, 65536): ([dict(num_warps=4, num_stages=3, ctas_per_sm=1), dict(num_warps=4, num_stages=2, ctas_per_sm=1)],
                           [32, 66, 132, 264, 396]),
}


def split_sweep(dev):
    from gaac_hf.kernels import LaunchConfig

    out = []
    for (shape, B, S), (cfgs, splits) in SPLIT_SWEEP.items():
        case = Case(shape, B, S, dev)
        for kw in cfgs:
            for n in splits:
                us, _ = _try("cuda", lambda: case.cuda(LaunchConfig(num_splits=n, **kw)))
                out.append(dict(shape=shape, batch=B, context=S, config=kw, splits=n, us=us))
                print(f"  splits {shape} B={B} {S}: {kw} x {n} -> {us}", flush=True)
        del case
        torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="Qwen3 B=1 64K/128K and B=4 64K only")
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--split-sweep", action="store_true")
    ap.add_argument("--use-sweep", action="store_true", help="grid with each shape's best sweep config")
    args = ap.parse_args(argv)
    from gaac_hf.kernels import LaunchConfig

    dev = torch.device("cuda")
    t_start = time.time()
    result = dict(provenance(sys.argv), block_size=T, timer="cuda-graph replay, L2 flushed, median of 15",
                  shapes={k: dict(q_heads=v[0], kv_heads=v[1], head_dim=v[2]) for k, v in SHAPES.items()},
                  same_shape=SAME_SHAPE, sweep={}, rows=[], cut=[])
    best = {}
    if args.split_sweep:
        result["split_sweep"] = split_sweep(dev)
    if args.sweep:
        for shape, B, S in (("qwen3-8b", 1, 65536), ("qwen3-8b", 4, 65536), ("smollm2-135m", 1, 65536),
                            ("gemma3", 1, 65536)):
            rows, cfg = sweep(shape, B, S, dev)
            result["sweep"][f"{shape}/B{B}/{S}"] = rows
            best.setdefault(shape, {})[B] = cfg
    if args.quick:
        cases = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("qwen3-8b", 1, 16384),
                 ("qwen3-8b", 16, 32768), ("gemma3", 1, 65536), ("smollm2-135m", 1, 65536), ("qwen3-8b", 4, 16384)]
    else:
        cases = [(s, b, c) for s in SHAPES for b in BATCH for c in CTX]
    for shape, B, S in cases:
        if time.time() - t_start > args.budget_s:
            result["cut"].append(dict(shape=shape, batch=B, context=S))
            continue
        case = Case(shape, B, S, dev)
        ref = case.sdpa("fa2")()
        ref = ref.squeeze(2)
        us = {}
        err = {}
        # the grid runs the product's defaults (what a user gets); --use-sweep runs each shape's best
        cfgs = best.get(shape, {}) if args.use_sweep else {}
        kw = cfgs.get(B) or cfgs.get(1) or {}
        us["cuda_bf16"], err["cuda_bf16"] = _try("cuda", lambda: case.cuda(LaunchConfig(**kw)), ref)
        if args.quick:
            pages = case.contiguous_pages()
            us["cuda_bf16_unshuffled"], _ = _try("cuda", lambda: case.cuda(LaunchConfig(**kw), pages), ref)
            del pages
        us["triton_bf16"], err["triton_bf16"] = _try("triton", case.triton, ref)
        us["fa2"], _ = _try("fa2", lambda: case.sdpa("fa2"))
        us["cudnn"], err["cudnn"] = _try("cudnn", lambda: case.sdpa("cudnn"), ref)
        row = dict(shape=shape, batch=B, context=S, us=us, rel_err_vs_fa2=err, cuda_config=kw,
                   kv_bytes=case.kv_bytes,
                   tbps={k: (case.kv_bytes / (v * 1e-6) / 1e12 if v else None) for k, v in us.items()})
        row["cuda_vs_cudnn"] = us["cudnn"] / us["cuda_bf16"] if us["cudnn"] and us["cuda_bf16"] else None
        row["cuda_vs_fa2"] = us["fa2"] / us["cuda_bf16"] if us["fa2"] and us["cuda_bf16"] else None
        result["rows"].append(row)
        f = lambda x: f"{x:8.1f}" if x else "   -    "  # noqa: E731
        print(f"{shape:13s} B={B:2d} {S:6d}: cuda {f(us['cuda_bf16'])} triton {f(us['triton_bf16'])} "
              f"fa2 {f(us['fa2'])} cudnn {f(us['cudnn'])}  vs cudnn {row['cuda_vs_cudnn'] or 0:.3f} "
              f"vs fa2 {row['cuda_vs_fa2'] or 0:.3f}  err {err['cuda_bf16']}", flush=True)
        del case
        torch.cuda.empty_cache()
    harness.write_result(args.out, result)
    print(f"wrote {args.out} ({len(result['rows'])} rows, {len(result['cut'])} cut) in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
