"""Issue 14 lab sweep: the v3 standalone decoder and decode-and-reduce under their compile-time knobs.

    python lab/experiments/codec_v3_sweep.py --kv .kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_sweep.json

Same data, tiling, L2 flush and timing as eval/bench_codec_v3.py (real SmolLM2 K/V, ~1 GB of BF16 per head_dim,
medians of CUDA-event timings, the copy rate of the same bytes in the same process). Per variant (kernels.cu
defines): WINDOW_SEGS (segments per warp item), DECODE_MIN_CTAS (= REDUCE_MIN_CTAS here: the register cap),
DECODE_STAGE (1: windows staged in shared memory, fix-ups there, 512-byte contiguous stores). Each decode is
checked bit for bit against the input (output poisoned first), each reduce fold against the input's fold.
The product's launchers are not touched: this builds the modules itself through the package's runtime.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gaac_hf.codec.v3 import encode_blocks_v3, pack_blocks
from gaac_hf.format.v3 import GeometryV3
from gaac_hf.kernels.cuda import codec_v3 as cu
from gaac_hf.kernels.cuda import runtime

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))  # after the package imports: the repo root must not shadow PyPI packages
from bench_codec_v3 import tile_pool, timed, widen  # noqa: E402


W1_GRID = False
VARIANTS: list = []  # --variants W:M:S:T[:P] ...


def variants(segs: int) -> list[dict]:
    """Call W2 (session 22): the old default, W1's best and the bulk-store candidates (DECODE_THREADS 128 fits
    4-segment staged windows in 32 KB); --w1 gives call W1's grid."""
    if VARIANTS:
        return [dict(WINDOW_SEGS=min(w, segs), DECODE_MIN_CTAS=m, REDUCE_MIN_CTAS=m, DECODE_STAGE=st, DECODE_THREADS=t,
                     DECODE_PREFETCH=(rest or (0,))[0])
                for w, m, st, t, *rest in VARIANTS]
    if not W1_GRID:
        whole = (segs + (segs + 7) // 8 - 1) // ((segs + 7) // 8)
        v = lambda w, m, s, t: dict(WINDOW_SEGS=min(w, segs), DECODE_MIN_CTAS=m, REDUCE_MIN_CTAS=m, DECODE_STAGE=s, DECODE_THREADS=t)  # noqa: E731
        return [v(whole, 4, 0, 256), v(2, 4, 1, 256), v(2, 4, 2, 256), v(4, 8, 2, 128), v(4, 8, 1, 128), v(2, 8, 2, 128),
                v(4, 10, 2, 128)]
    out = []
    for win in sorted({1, 2, 4, min(8, segs)}):
        for m in (2, 3, 4):
            out.append(dict(WINDOW_SEGS=win, DECODE_MIN_CTAS=m, REDUCE_MIN_CTAS=m, DECODE_STAGE=0, DECODE_THREADS=256))
    for win in (1, 2):
        for m in (2, 4):
            out.append(dict(WINDOW_SEGS=win, DECODE_MIN_CTAS=m, REDUCE_MIN_CTAS=3, DECODE_STAGE=1, DECODE_THREADS=256))
    return out


def run_d(x, b8, b16, gbytes, reps, flush) -> dict:
    dev = x.device
    g = GeometryV3(64, x.shape[-1])
    ref = encode_blocks_v3(x, b8, b16, g)
    pool, entries = pack_blocks(ref, x)
    ratio = 2 * x.numel() / (pool.numel() + 8 * entries.numel())
    times = max(1, int(gbytes * 1e9 // (2 * x.numel())))
    xt = x.repeat(times, 1, 1)
    b8t, b16t = b8.repeat(times, 1), b16.repeat(times, 1)
    bigpool, bigent = tile_pool(pool, entries, times)
    bigent = bigent.to(torch.int64).contiguous()
    b8p, dbp, stride = cu.pair_tables(b8t, b16t, g)
    n = bigent.numel()
    nbytes = xt.numel() * 2
    dst = torch.empty_like(xt)
    t_copy = timed(lambda: dst.copy_(xt), reps, flush)
    del dst
    copy = 2 * nbytes / t_copy / 1e9
    bound = copy / (1 + 1 / ratio)
    want_fold = cu.xor_fold(xt)
    out = torch.empty_like(xt)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    base = dict(BLOCK_T=64, HEAD_DIM=g.head_dim)
    for v in variants(g.segments):
        t0 = time.time()
        mod = runtime.load(cu.SOURCE, base | v, dev)
        build_s = time.time() - t0
        nwin = -(-g.segments // v["WINDOW_SEGS"])
        th = v["DECODE_THREADS"]
        grid = max(1, min(-(-(n * nwin) // (th // 32)), 16 * sms))
        args_dec = (bigpool, bigent, b8p, dbp, np.int32(stride), out, np.int32(n))
        dec = lambda: runtime.launch(mod, "gaac_v3_decode", (grid,), (th,), 0, *args_dec, device=dev)  # noqa: E731
        out.view(torch.int16).fill_(0x7FA5)
        dec()
        torch.cuda.synchronize()
        exact = bool(torch.equal(out.view(torch.int16), xt.view(torch.int16)))
        t_dec = timed(dec, reps, flush)
        fold = torch.zeros(grid, dtype=torch.int32, device=dev)
        args_red = (bigpool, bigent, b8p, dbp, np.int32(stride), fold, np.int32(n))
        red = lambda: runtime.launch(mod, "gaac_v3_decode_reduce", (grid,), (th,), 0, *args_red, device=dev)  # noqa: E731
        red()
        torch.cuda.synchronize()
        red_exact = cu.xor_fold(fold) == want_fold
        t_red = timed(red, reps, flush)
        regs = {}
        for name in ("gaac_v3_decode", "gaac_v3_decode_reduce"):
            try:
                k = mod.kernel(name)
                regs[name] = int(k.attributes.num_regs)
            except Exception as exc:  # attribute names differ between cuda.core releases
                regs[name] = repr(exc)[:80]
        r = dict(v, grid=grid, decode_GBps=round(nbytes / t_dec / 1e9, 1), fraction_of_bound=round(nbytes / t_dec / 1e9 / bound, 4),
                 reduce_values_per_s=float(f"{nbytes / 2 / t_red:.4g}"), decode_exact=exact, reduce_exact=bool(red_exact),
                 median_s={"decode": t_dec, "reduce": t_red}, regs=regs, build_s=round(build_s, 2))
        rows.append(r)
        print(f"d={g.head_dim} W{v['WINDOW_SEGS']} M{v['DECODE_MIN_CTAS']} S{v['DECODE_STAGE']} T{th}: decode {r['decode_GBps']:7.1f} GB/s "
              f"({100 * r['fraction_of_bound']:5.1f}% of {bound:.0f}) exact {exact}; reduce {r['reduce_values_per_s']:.3g}/s "
              f"exact {red_exact}; regs {regs}", flush=True)
    del out, xt
    return {"head_dim": g.head_dim, "ratio": round(ratio, 5), "copy_GBps": round(copy, 1), "decode_bound_GBps": round(bound, 1),
            "blocks": n, "values": nbytes // 2, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", default=str(REPO / ".kvdump" / "smollm2_kv_v3.pt"))
    ap.add_argument("--gbytes", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--out", required=True)
    ap.add_argument("--w1", action="store_true", help="call W1's grid of knobs")
    ap.add_argument("--variants", nargs="+", metavar="W:M:S:T[:P]", help="window segments, min CTAs, stage, threads[, L2 prefetch distance in items]")
    args = ap.parse_args()
    global W1_GRID, VARIANTS
    W1_GRID = args.w1
    VARIANTS = [tuple(int(x) for x in v.split(":")) for v in args.variants or []]
    dev = torch.device("cuda")
    kv = torch.load(args.kv)
    x, b8, b16 = kv["x"].to(dev), kv["b8"].to(dev), kv["b16"].to(dev)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    t0 = time.time()
    res = {"commit": os.environ.get("GAAC_COMMIT", "unknown"), "command": "python " + " ".join(sys.argv),
           "gpu": torch.cuda.get_device_name(dev), "versions": {"torch": torch.__version__}, "per_head_dim": {}}
    for d in (int(s) for s in args.head_dims.split(",")):
        xs, s8, s16 = widen(x, b8, b16, d // 64)
        res["per_head_dim"][str(d)] = run_d(xs, s8, s16, args.gbytes, args.reps, flush)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    res["seconds"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
