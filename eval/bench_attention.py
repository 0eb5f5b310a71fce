"""Decode-attention benchmark on one GPU: SDPA flash (FA2), SDPA cuDNN, our BF16 kernel, GAAC fused.

    python eval/bench_attention.py --out eval/results/attention_h200.json [--budget-s 300] [--smoke]

All four run in the same process on the same K/V (synthetic, KV-like exponent statistics from
``gaac_hf.calibration.synthetic``: per-channel log-normal magnitudes, a sink token; calibrated on the first 4K
tokens). Times are medians of ``triton.testing.do_bench`` (events; it flushes the L2 with a 256 MB
write before every call, so repeated calls never read the KV from cache). First a small config sweep
on the first case of each shape picks num_warps / programs-per-SM for each of our kernels (per shape
since session 5: one config for all shapes left the d=256 kernel spilling); then the grid
runs in priority order until the time budget is spent (cut cases are listed in the JSON).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch
import triton

from gaac_hf.format import BlockGeometry
from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.triton import attention as A
from gaac_hf.kernels.triton import pack as P
from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

SHAPES = {  # q heads, kv heads, head_dim
    "qwen3-8b": (32, 8, 128),
    "smollm2-135m": (9, 3, 64),
    "gemma3": (4, 1, 256),
}
SAME_SHAPE = {"llama-3.1-8b": "qwen3-8b"}  # Llama-3.1-8B attention is 32 q / 8 kv / d128 too
CTX = [4096, 16384, 32768, 65536, 131072]


def case_list(smoke: bool):
    if smoke:
        return [("qwen3-8b", 1, 256), ("smollm2-135m", 2, 200), ("gemma3", 1, 130)]
    order = []
    order += [("qwen3-8b", 1, c) for c in (65536, 131072, 32768, 16384, 4096)]
    order += [("qwen3-8b", 4, c) for c in (65536, 32768, 131072, 16384, 4096)]
    order += [(s, 1, c) for s in ("smollm2-135m", "gemma3") for c in (65536, 131072, 32768, 16384, 4096)]
    order += [("qwen3-8b", 16, c) for c in (32768, 65536, 16384, 4096, 131072)]
    order += [(s, b, c) for b in (4, 16) for s in ("smollm2-135m", "gemma3") for c in (65536, 32768, 16384, 4096, 131072)]
    return order


TIMER = "events"  # --timer: "events" (do_bench), "graph" (CUDA graph replay), "both"
timeit_graph = harness.timeit_graph


def timeit(fn, smoke, timer=None):
    if smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    if (timer or TIMER) == "graph":
        return timeit_graph(fn)
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


class Case:
    def __init__(self, shape, B, S, dev, seed=0):
        hq, hkv, d = SHAPES[shape]
        self.shape, self.B, self.S, self.hq, self.hkv, self.d = shape, B, S, hq, hkv, d
        self.k = synthetic_kv((B, hkv, S, d), "k", seed=seed, device=dev)
        self.v = synthetic_kv((B, hkv, S, d), "v", seed=seed + 1, device=dev)
        self.kb = calibrate(self.k)
        self.vb = calibrate(self.v)
        # mode shares of the calibration prefix (format v2: escape streams at their exact length)
        from gaac_hf.codec import encode_blocks

        g0 = self.geom = BlockGeometry(block_size=64, head_dim=d)
        n0 = min(S, 4096) // 64
        probe = []
        for x, (b8, b16) in ((self.k, self.kb), (self.v, self.vb)):
            blk = x[0, :, : n0 * 64].reshape(hkv * n0, 64, d)
            hb = torch.arange(hkv, device=dev).repeat_interleave(n0)
            probe.append(encode_blocks(blk, b8[hb], b16[hb], g0))
        tags = torch.cat([e.tags.flatten() for e in probe])
        self.modes = [float((tags == m).float().mean()) for m in range(3)]
        lens = [S] * B
        self.pk = P.pack_paged_kv(self.k, lens, *self.kb, self.geom)
        self.pv = P.pack_paged_kv(self.v, lens, *self.vb, self.geom)
        self.bk = P.pack_paged_kv(self.k, lens, None, None, self.geom, compress=False)
        self.bv = P.pack_paged_kv(self.v, lens, None, None, self.geom, compress=False)
        self.kv, self.bkv = P.paged_kv(self.pk, self.pv), P.paged_kv(self.bk, self.bv)
        g = torch.Generator(device=dev).manual_seed(seed + 2)
        self.q = torch.randn(B, hq, d, generator=g, device=dev).to(torch.bfloat16)
        self.q4 = self.q.unsqueeze(2)
        self.out = torch.empty_like(self.q)

    def nbytes(self):
        g = self.geom
        total = 0
        for p in (self.pk, self.pv):
            table = p.tensor.table
            n_slots = int((table >= 0).sum())
            n_raw = int((table < 0).sum())
            total += n_slots * (g.slot_bytes + 8) + p.escape_bytes + n_raw * g.raw_bytes + table.numel() * 4
            total += int(p.tail_len.sum()) * self.hkv * self.d * 2
        bf16 = 2 * self.B * self.hkv * self.S * self.d * 2
        return total, bf16

    def gaac(self, warps=4, pps=4, ts=32, stages=1, maxnreg=None):
        S = self.splits(pps)
        launch = LaunchConfig(num_splits=S, num_warps=warps, num_stages=stages, tile_tokens=ts, maxnreg=maxnreg)
        return lambda: A.gaac_decode_attention(self.q, self.kv, out=self.out, launch=launch)

    def bf16(self, warps=4, pps=4, ts=32, stages=1, maxnreg=None, same_path=False):
        S = self.splits(pps)
        launch = LaunchConfig(num_splits=S, num_warps=warps, num_stages=stages, tile_tokens=ts, maxnreg=maxnreg)
        return lambda: A.bf16_decode_attention(self.q, self.bkv, out=self.out, launch=launch, same_path=same_path)

    def decompress(self, backend):
        """The cache's unfused CUDA path (``GAACCache(fused=False)`` / ``"auto"``): K and V decoded
        through their block tables into BF16 with their tails in one launch (``decode_tables_triton``,
        allocated per call as in ``GAACLayer.full_kv``), then SDPA on them."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from gaac_hf.kernels.triton.decode import decode_tables_triton

        be = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
        T = self.geom.block_size
        nb, tl = self.S // T, self.S % T
        pools = [self.kv.k, self.kv.v]
        tails = [self.kv.k.tail[:, :, :tl], self.kv.v.tail[:, :, :tl]]

        def f():
            kv = torch.empty(2, self.B, self.hkv, self.S, self.d, dtype=torch.bfloat16, device=self.q.device)
            decode_tables_triton(pools, self.geom, nb, kv, tails)
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(self.q4, kv[0], kv[1], enable_gqa=True)

        return f

    def splits(self, pps):
        A.PROGRAMS_PER_SM = pps
        return A.default_num_splits(self.B, self.hkv, self.pk.max_blocks, self.q.device)

    def sdpa(self, backend):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

        def f():
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(self.q4, self.k, self.v, enable_gqa=True)

        return f


def run_sdpa(case, name, smoke, timer=None):
    if smoke:
        return None, None
    try:
        f = case.sdpa(name)
        o = f()
        torch.cuda.synchronize()
        return timeit(f, smoke, timer), o.squeeze(2)
    except Exception as e:  # a backend that refuses the shape is recorded, not fatal
        print(f"  {name} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None, None


def sdpa_kernel_ctx(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend])


def bits_equal(a, b):
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


SWEEP = {  # (num_warps, programs per SM, sub-tile tokens, num_stages, maxnreg)
    "gaac": [(4, 4, 32, 1, None), (4, 4, 32, 2, None), (4, 8, 32, 1, None), (8, 4, 64, 1, None), (4, 4, 16, 1, None),
             (8, 4, 32, 1, None), (8, 2, 16, 1, None)],  # 8 warps: d=256 spills at 4 (sm_90 count)
    "bf16": [(4, 4, 64, 1, None), (4, 4, 32, 1, None), (4, 4, 64, 2, None), (4, 4, 64, 3, None), (8, 4, 64, 2, None)],
}


def sweep(case, smoke):
    """Pick (warps, programs/SM, sub-tile, stages) for GAAC and BF16 on the first case of a shape."""
    res = {"gaac": [], "bf16": []}
    for kind in ("gaac", "bf16"):
        for w, pps, ts, st, mr in SWEEP[kind][: 2 if smoke else None]:
            fn = case.gaac(w, pps, ts, st, mr) if kind == "gaac" else case.bf16(w, pps, ts, st, mr)
            try:
                fn()
                us = timeit(fn, smoke)
                info = dict(A.LAST_LAUNCH)
            except Exception as e:
                print(f"  sweep {kind} w{w} pps{pps} ts{ts} st{st} mr{mr} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            res[kind].append(dict(warps=w, pps=pps, ts=ts, stages=st, maxnreg=mr, us=us, **info))
            print(f"  sweep {kind:4s} warps={w} pps={pps} ts={ts} stages={st} maxnreg={mr}: {us:8.1f} us  {info}", flush=True)
    best = {k: min(v, key=lambda r: r["us"]) for k, v in res.items() if v}
    return best, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="eval/results/attention_h200.json")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no SDPA (CPU interpreter check)")
    ap.add_argument("--asm-dir", default=None, help="write PTX/SASS of the best GAAC and BF16 kernels here")
    ap.add_argument("--max-cases", type=int, default=1000)
    ap.add_argument("--timer", choices=("events", "graph", "both"), default="events",
                    help="us = do_bench events (host launch included when it is the bottleneck) or CUDA-graph "
                         "replay (GPU time only); 'both' adds us_graph to every row")
    ap.add_argument("--decompress", action="store_true",
                    help="also time the unfused path: decode K/V through the tables, then SDPA cuDNN / FA2")
    ap.add_argument("--shapes", default="", help="comma-separated shape filter, e.g. qwen3-8b")
    ap.add_argument("--batches", default="", help="comma-separated batch filter, e.g. 4,16")
    args = ap.parse_args()
    global TIMER
    TIMER = "graph" if args.timer == "graph" else "events"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    meta = dict(
        gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter smoke run)",
        versions=dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                      cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if dev == "cuda" else None),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        timer=args.timer,
        method=("median of triton.testing.do_bench (L2 flushed before each call)" if args.timer != "graph" else
                "CUDA-graph replay, 10 x (256 MB L2 flush + call) minus 10 flushes, median of 15 replays")
               + ("; us_graph: CUDA-graph replay (GPU time without host launch)" if args.timer == "both" else "")
               + "; synthetic KV-like data "
               "(gaac_hf.calibration.synthetic), windows calibrated on the first 4K tokens; block 64 tokens",
        note_same_shape={k: f"same attention shape as {v}: rows measured once under {v}" for k, v in SAME_SHAPE.items()},
        rows=[], cut=[],
    )
    cases = case_list(args.smoke)
    if args.shapes:
        keep = set(args.shapes.split(","))
        cases = [c for c in cases if c[0] in keep]
    if args.batches:
        keep_b = {int(x) for x in args.batches.split(",")}
        cases = [c for c in cases if c[1] in keep_b]
    bests = {}  # launch config per attention shape (head dim and GQA change registers and spills)
    for ci, (shape, B, S) in enumerate(cases):
        if time.time() - t0 > args.budget_s or ci >= args.max_cases:
            meta["cut"] = [dict(shape=s, batch=b, context=c) for s, b, c in cases[ci:]]
            print(f"budget spent: cut {len(cases) - ci} cases", flush=True)
            break
        try:
            case = Case(shape, B, S, dev, seed=ci)
        except torch.OutOfMemoryError:
            meta["cut"].append(dict(shape=shape, batch=B, context=S, why="OOM"))
            continue
        if shape not in bests:
            bests[shape], sw = sweep(case, args.smoke)
            meta.setdefault("sweep", {})[shape] = sw
            meta.setdefault("config", {})[shape] = bests[shape]
            best = bests[shape]
            if args.asm_dir and not args.smoke:
                os.makedirs(args.asm_dir, exist_ok=True)
                for kind, mk in (("gaac", case.gaac), ("bf16", case.bf16)):
                    c = best[kind]
                    mk(c["warps"], c["pps"], c["ts"], c["stages"], c["maxnreg"])()
                    for fmt in ("sass",):
                        try:
                            txt = A.LAST_KERNEL.asm[fmt]
                            with open(os.path.join(args.asm_dir, f"attn_{shape}_{kind}.{fmt}"), "w") as f:
                                f.write(txt if isinstance(txt, str) else txt.decode())
                        except Exception as e:
                            print(f"  no {fmt}: {e}", flush=True)
        best = bests[shape]
        g, b = best["gaac"], best["bf16"]
        f_g = case.gaac(g["warps"], g["pps"], g["ts"], g["stages"], g["maxnreg"])
        f_b = case.bf16(b["warps"], b["pps"], b["ts"], b["stages"], b["maxnreg"])
        o_g = f_g().clone()
        info = dict(A.LAST_LAUNCH)
        o_b = f_b().clone()
        o_same = case.bf16(g["warps"], g["pps"], g["ts"], g["stages"], g["maxnreg"], same_path=True)().clone()
        # the BF16 kernel at GAAC's exact config: the bit-identity claim of the baseline
        o_b_same_cfg = case.bf16(g["warps"], g["pps"], g["ts"], g["stages"], g["maxnreg"])().clone()
        us = {"gaac": timeit(f_g, args.smoke), "bf16_ours": timeit(f_b, args.smoke)}
        us["fa2"], o_fa = run_sdpa(case, "fa2", args.smoke)
        us["cudnn"], _ = run_sdpa(case, "cudnn", args.smoke)
        decomp_bits = None
        if args.decompress and not args.smoke:
            f_d = case.decompress("cudnn")
            o_d = f_d()
            with sdpa_kernel_ctx("cudnn"):
                o_c = torch.nn.functional.scaled_dot_product_attention(case.q4, case.k, case.v, enable_gqa=True)
            decomp_bits = bits_equal(o_d, o_c)  # same input bits, same cuDNN kernel: the same output bits
            us["gaac_decompress_cudnn"] = timeit(f_d, False)
            us["gaac_decompress_fa2"] = timeit(case.decompress("fa2"), False)  # fused="auto" leaves cuDNN out
        us_graph = None
        if args.timer == "both" and not args.smoke:
            def graph_or_none(f, name):
                try:
                    return timeit(f, False, "graph")
                except Exception as e:  # recorded, not fatal: events timing of the row stands
                    print(f"  graph timing of {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    return None

            us_graph = {"gaac": graph_or_none(f_g, "gaac"), "bf16_ours": graph_or_none(f_b, "bf16_ours")}
            us_graph["fa2"], _ = run_sdpa(case, "fa2", False, "graph")
            us_graph["cudnn"], _ = run_sdpa(case, "cudnn", False, "graph")
            if args.decompress:
                us_graph["gaac_decompress_cudnn"] = graph_or_none(case.decompress("cudnn"), "decompress")
                us_graph["gaac_decompress_fa2"] = graph_or_none(case.decompress("fa2"), "decompress fa2")
        ref = o_fa if o_fa is not None else A.attention_reference(case.q, case.k, case.v, [S] * B).to(dev)
        rel = float(((o_g.double() - ref.double()).norm() / ref.double().norm()).item())
        gb, bfb = case.nbytes()
        row = dict(
            shape=shape, batch=B, context=S, hq=case.hq, hkv=case.hkv, head_dim=case.d,
            us=us, **({"us_graph": us_graph} if us_graph else {}), gaac_bytes=gb, bf16_bytes=bfb, ratio=bfb / gb,
            speedup={k: (us[k] / us["gaac"] if us.get(k) else None) for k in ("fa2", "cudnn", "bf16_ours")},
            tbps={"gaac": gb / us["gaac"] / 1e6, **{k: (bfb / us[k] / 1e6 if us.get(k) else None) for k in ("fa2", "cudnn", "bf16_ours")}},
            bit_identical_vs_bf16_ours=bits_equal(o_g, o_b), bit_identical_vs_same_path=bits_equal(o_g, o_same),
            bit_identical_vs_bf16_ours_same_config=bits_equal(o_g, o_b_same_cfg),
            rel_err_vs_fa2=rel, modes_3_4_raw=case.modes, fits_fraction=[case.pk.fits_fraction, case.pv.fits_fraction],
            escape_bytes_per_block=(case.pk.escape_bytes + case.pv.escape_bytes) / max(1, int((case.pk.tensor.table >= 0).sum() + (case.pv.tensor.table >= 0).sum())),
            slot_bytes=case.geom.slot_bytes, format_version=2, launch=info,
            **({"bit_identical_decompress_cudnn_vs_cudnn": decomp_bits} if decomp_bits is not None else {}),
        )
        meta["rows"].append(row)
        sp = row["speedup"]
        print(f"{shape:13s} B={B:2d} S={S:6d} gaac {us['gaac']:8.1f}  ours-bf16 {us['bf16_ours']:8.1f}  "
              f"fa2 {us['fa2'] or float('nan'):8.1f}  cudnn {us['cudnn'] or float('nan'):8.1f}  "
              f"x/cudnn {sp['cudnn'] or float('nan'):.2f}  x/fa2 {sp['fa2'] or float('nan'):.2f}  "
              f"ratio {row['ratio']:.3f}  bits={row['bit_identical_vs_bf16_ours']}/{row['bit_identical_vs_bf16_ours_same_config']}/{row['bit_identical_vs_same_path']} "
              f"rel={rel:.1e}", flush=True)
        if decomp_bits is not None:
            print(f"    decompress+cudnn {us['gaac_decompress_cudnn']:8.1f} us  bits==cudnn {decomp_bits}  "
                  f"decompress+fa2 {us['gaac_decompress_fa2']:8.1f} us", flush=True)
        if us_graph:
            print("    graph: " + "  ".join(f"{k} {v:8.1f}" if v else f"{k} -" for k, v in us_graph.items())
                  + f"  x/cudnn {us_graph['cudnn'] / us_graph['gaac'] if us_graph.get('cudnn') and us_graph.get('gaac') else float('nan'):.2f}", flush=True)
        del case
        if dev == "cuda":
            torch.cuda.empty_cache()
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        harness.write_result(args.out, meta)
    meta["elapsed_s"] = time.time() - t0
    harness.write_result(args.out, meta)


if __name__ == "__main__":
    main()
