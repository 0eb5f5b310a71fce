"""Fused GAAC v3 decode attention on one GPU vs FA2, cuDNN and our BF16 twin (same process).

    python eval/bench_attention_v3.py --out eval/results/attention_h200.json [--quick] [--sweep]

K/V are KV-like synthetic values (``gaac_hf.calibration.synthetic``: per-channel log-normal scales,
a sink token; ~90% of groups 3-bit as on real SmolLM2 K/V), calibrated per kv head on their first
4,096 tokens, encoded by the CUDA v3 encoder into shuffled pools. Every kernel reads the same values:
FA2 / cuDNN (SDPA backends) the dense BF16 tensors, the BF16 twin (``cuda_bf16``, the CUDA kernel the
fused one is built on) a shuffled paged BF16 cache, ``gaac`` the v3 pools. Each time is GPU time
from CUDA-graph replay with the L2 flushed before every call (``harness.timeit_graph``), medians.
Each row also records whether the fused output is bit-identical to the twin's at the same launch
(``bit_identical``) and the bytes each reads (``kv_bytes`` BF16, ``gaac_bytes`` pools + tails).
``--sweep`` first times launch configurations of the fused kernel on the key cases.
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
QUICK = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("qwen3-8b", 1, 16384),
         ("qwen3-8b", 16, 32768), ("gemma3", 1, 65536), ("smollm2-135m", 1, 65536), ("qwen3-8b", 4, 16384)]


class Case:
    def __init__(self, shape, B, S, dev, seed=0):
        from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
        from gaac_hf.kernels.cuda.attention import pack_paged_bf16
        from gaac_hf.kernels.cuda.fused_attention import pack_paged_v3

        hq, hkv, d = SHAPES[shape]
        self.shape, self.B, self.S, self.hq, self.hkv, self.d = shape, B, S, hq, hkv, d
        self.k = synthetic_kv((B, hkv, S, d), "k", seed, device=dev)
        self.v = synthetic_kv((B, hkv, S, d), "v", seed + 1, device=dev)
        self.q = torch.randn(B, hq, d, generator=torch.Generator(device=dev).manual_seed(seed), device=dev).to(torch.bfloat16)
        bk, bv = calibrate(self.k), calibrate(self.v)
        bases = torch.stack([torch.stack(bk), torch.stack(bv)])
        lens = [S] * B
        self.kv = pack_paged_v3(self.k, self.v, lens, T, bases)
        self.pk, self.pv = pack_paged_bf16(self.k, lens, T), pack_paged_bf16(self.v, lens, T)
        self.out = torch.empty_like(self.q)
        self.kv_bytes = 2 * B * hkv * S * d * 2
        g = self.kv.k
        self.gaac_bytes = sum(p.pool.numel() + p.tail.numel() * 2 + p.table.numel() * 8 for p in (self.kv.k, self.kv.v))
        self.bf16_blocks = int((self.kv.k.table & 1).sum() + (self.kv.v.table & 1).sum())
        del g

    def gaac(self, config=None):
        from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3

        return lambda: gaac_decode_attention_v3(self.q, self.kv, launch=config, out=self.out)

    def cuda(self, config=None):
        from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors

        pk, pv = self.pk, self.pv
        return lambda: bf16_decode_attention_tensors(
            self.q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"], pk["num_blocks"],
            pk["tail_len"], config=config, out=self.out)

    def sdpa(self, backend):
        return harness.sdpa_decode(backend, self.q, self.k, self.v)

    def bit_identical(self, config=None) -> bool:
        """The fused output vs the twin's at the same launch (the fused planner's split count)."""
        from gaac_hf.kernels import LaunchConfig
        from gaac_hf.kernels.cuda.fused_attention import plan

        config = config or LaunchConfig()
        p = plan(self.B, self.hkv, self.hq // self.hkv, T, self.d, self.kv.k.table.shape[2] * T + T, self.q.device, config)
        a = self.gaac(config)().clone()
        b = self.cuda(LaunchConfig(num_splits=p["splits"], num_warps=p["warps"]))().clone()
        return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


_try = harness.time_and_error


SWEEP = [dict(num_warps=w, num_stages=s, ctas_per_sm=c, producer_segments=p)
         for (w, s, c, p) in ((2, 3, 3, 2), (2, 3, 3, 1), (2, 2, 3, 1), (2, 4, 2, 2), (2, 6, 2, 2), (4, 3, 1, 1),
                              (4, 4, 1, 2), (1, 3, 5, 1), (1, 4, 4, 2))]


def sweep(case):
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.fused_attention import cta_bytes, threads_of

    rows = []
    for kw in SWEEP:
        p = kw["producer_segments"]
        if (cta_bytes(case.d, kw["num_warps"], kw["num_stages"], p) + 1024) * kw["ctas_per_sm"] > 228 * 1024:
            continue
        if threads_of(case.d, kw["num_warps"], p) * kw["ctas_per_sm"] > 2048:
            continue
        us, _ = _try(f"gaac {kw}", lambda: case.gaac(LaunchConfig(**kw)))
        rows.append(dict(config=kw, us=us))
        print(f"  sweep {case.shape} B={case.B} {case.S}: {kw} -> {us}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the key cases only")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args(argv)
    from gaac_hf.kernels import LaunchConfig

    dev = torch.device("cuda")
    t_start = time.time()
    result = dict(harness.provenance(shapes=SHAPES, argv=sys.argv), cuda=torch.version.cuda, block_size=T,
                  timer="cuda-graph replay, L2 flushed, median of 15", data="synthetic KV-like (calibration.synthetic)",
                  shapes={k: dict(q_heads=v[0], kv_heads=v[1], head_dim=v[2]) for k, v in SHAPES.items()},
                  same_shape=SAME_SHAPE, sweep={}, rows=[], cut=[])
    if args.sweep:
        for shape, B, S in (("qwen3-8b", 1, 65536), ("qwen3-8b", 4, 65536), ("gemma3", 1, 65536)):
            case = Case(shape, B, S, dev)
            result["sweep"][f"{shape}/B{B}/{S}"] = sweep(case)
            del case
            torch.cuda.empty_cache()
    cases = QUICK if args.quick else [(s, b, c) for s in SHAPES for b in BATCH for c in CTX]
    for shape, B, S in cases:
        if time.time() - t_start > args.budget_s:
            result["cut"].append(dict(shape=shape, batch=B, context=S))
            continue
        case = Case(shape, B, S, dev)
        ref = case.sdpa("fa2")().squeeze(2)
        us, err = {}, {}
        us["gaac"], err["gaac"] = _try("gaac", lambda: case.gaac(LaunchConfig()), ref)
        us["cuda_bf16"], err["cuda_bf16"] = _try("cuda", lambda: case.cuda(LaunchConfig()), ref)
        us["fa2"], _ = _try("fa2", lambda: case.sdpa("fa2"))
        us["cudnn"], err["cudnn"] = _try("cudnn", lambda: case.sdpa("cudnn"), ref)
        try:
            same = case.bit_identical()
        except Exception as e:  # recorded, not fatal
            print(f"  bit check failed: {e}", flush=True)
            same = None
        row = dict(shape=shape, batch=B, context=S, us=us, rel_err_vs_fa2=err, bit_identical=same,
                   kv_bytes=case.kv_bytes, gaac_bytes=case.gaac_bytes, ratio=case.kv_bytes / case.gaac_bytes,
                   bf16_stored_blocks=case.bf16_blocks,
                   tbps_bf16_equiv={k: (case.kv_bytes / (v * 1e-6) / 1e12 if v else None) for k, v in us.items()})
        for base in ("cudnn", "fa2", "cuda_bf16"):
            row[f"gaac_vs_{base}"] = us[base] / us["gaac"] if us[base] and us["gaac"] else None
        result["rows"].append(row)
        f = lambda x: f"{x:8.1f}" if x else "   -    "  # noqa: E731
        print(f"{shape:13s} B={B:2d} {S:6d}: gaac {f(us['gaac'])} bf16 {f(us['cuda_bf16'])} fa2 {f(us['fa2'])} "
              f"cudnn {f(us['cudnn'])}  vs cudnn {row['gaac_vs_cudnn'] or 0:.3f} vs fa2 {row['gaac_vs_fa2'] or 0:.3f} "
              f"vs bf16 {row['gaac_vs_cuda_bf16'] or 0:.3f} same={same} ratio {row['ratio']:.3f}", flush=True)
        del case
        torch.cuda.empty_cache()
    harness.write_result(args.out, result)
    print(f"wrote {args.out} ({len(result['rows'])} rows, {len(result['cut'])} cut) in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
