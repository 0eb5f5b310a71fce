"""GPU benchmark of the v3 CUDA codec on real SmolLM2 K/V (one process, one device call, < 5 minutes).

    python eval/bench_codec_v3.py --kv .kvdump/smollm2_kv_v3.pt [--out eval/results/codec_v3_<card>.json]

The K/V file (blocks [N, 64, 64] BF16 + per-block base8/base16) is written on the CPU by
``python eval/compression_v3.py --dump .kvdump/smollm2_kv_v3.pt`` (never committed; carry it).
head_dim 128 / 256 blocks are real values too: 2 / 4 real 64-channel blocks side by side, with their
bases. Each set is tiled (repeated) to ~--gbytes of BF16, far past the 50 MB L2, and every timed run
is preceded by an L2 flush (a write of a 256 MB buffer); medians of --reps CUDA-event timings.

Per head_dim: copy_GBps (device copy of the same BF16 bytes, read+write, this run), decode_GBps (BF16
output bytes / s), decode_bound_GBps (copy rate turned into the decoder's bound: it reads 1/ratio and
writes 1 byte per output byte, so bound = copy / (1 + 1/ratio)), decode_fraction_of_bound,
encode_GBps (BF16 input bytes / s), decode_reduce_values_per_s, ratio (BF16 bytes / pool bytes +
8-byte entries, untiled set), bit_exact (GPU encoder rows == reference rows; GPU decode of the whole
tiled pool == input; decode-reduce fold == input fold).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# (no sys.path insert of the repo root: its kernels/ folder would shadow the PyPI `kernels` that transformers
# 5.25 imports for hub kernels; gaac_hf comes from the install, README command 1)

from gaac_hf.kernels.cuda import codec_v3 as cu  # noqa: E402
from gaac_hf.codec.v3 import encode_blocks_v3, pack_blocks  # noqa: E402
from gaac_hf.format.v3 import GeometryV3  # noqa: E402


def widen(x, b8, b16, k):
    """k real 64-channel blocks side by side -> [N/k, 64, 64k] blocks (and their bases)."""
    n = x.shape[0] // k * k
    xs = x[:n].reshape(n // k, k, 64, 64).permute(0, 2, 1, 3).reshape(n // k, 64, 64 * k)
    return xs.contiguous(), b8[:n].reshape(n // k, 64 * k).contiguous(), b16[:n].reshape(n // k, 64 * k).contiguous()


def timed(fn, reps: int, flush: torch.Tensor) -> float:
    """Median seconds of fn() over reps runs, L2 flushed before each. A ~100 us device sleep after the flush keeps
    the GPU busy while the host enqueues fn's launch, so the events time the kernel, not the launcher's Python
    (call W2, session 22: without it the decoder's ~0.6 ms measured 8% slower through ``decode_pool_cuda``
    than through a bare launch)."""
    ts = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda._sleep(200_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def tile_pool(pool: torch.Tensor, entries: torch.Tensor, times: int) -> tuple[torch.Tensor, torch.Tensor]:
    big = pool.repeat(times)
    offs = torch.arange(times, device=pool.device, dtype=torch.int64) * pool.numel()
    return big, (entries[None, :] + offs[:, None]).reshape(-1)


def bench_one(x, b8, b16, gbytes: float, reps: int, flush) -> dict:
    dev = x.device
    g = GeometryV3(64, x.shape[-1])
    # correctness on the untiled set, against the reference (which runs on the GPU too)
    ref = encode_blocks_v3(x, b8, b16, g)
    got = cu.encode_blocks_cuda(x, b8, b16, g)
    enc_exact = bool(torch.equal(got.data, ref.data) and torch.equal(got.nbytes, ref.nbytes))
    pool, entries = pack_blocks(ref, x)
    ratio = 2 * x.numel() / (pool.numel() + 8 * entries.numel())
    times = max(1, int(gbytes * 1e9 // (2 * x.numel())))
    xt = x.repeat(times, 1, 1)
    b8t, b16t = b8.repeat(times, 1), b16.repeat(times, 1)
    bigpool, bigent = tile_pool(pool, entries, times)
    tables = cu.pair_tables(b8t, b16t, g)
    out = torch.empty_like(xt)
    out.view(torch.int16).fill_(0x7FA5)  # poison
    cu.decode_pool_cuda(bigpool, bigent, b8t, b16t, g, out=out, tables=tables)
    torch.cuda.synchronize()
    dec_exact = bool(torch.equal(out.view(torch.int16), xt.view(torch.int16)))
    fold = cu.decode_reduce_cuda(bigpool, bigent, b8t, b16t, g, tables=tables)
    red_exact = cu.xor_fold(fold) == cu.xor_fold(xt)
    nbytes = xt.numel() * 2
    dst = torch.empty_like(xt)
    t_copy = timed(lambda: dst.copy_(xt), reps, flush)
    t_dec = timed(lambda: cu.decode_pool_cuda(bigpool, bigent, b8t, b16t, g, out=out, tables=tables), reps, flush)
    t_red = timed(lambda: cu.decode_reduce_cuda(bigpool, bigent, b8t, b16t, g, tables=tables), reps, flush)
    t_enc = timed(lambda: cu.encode_blocks_cuda(xt, b8t, b16t, g, zero_fill=False), reps, flush)
    copy = 2 * nbytes / t_copy / 1e9
    bound = copy / (1 + 1 / ratio)
    dec = nbytes / t_dec / 1e9
    del dst, out, xt
    return {
        "head_dim": g.head_dim, "values": nbytes // 2, "tiled_times": times, "blocks": int(bigent.numel()),
        "ratio": round(ratio, 5), "copy_GBps": round(copy, 1), "decode_GBps": round(dec, 1),
        "decode_bound_GBps": round(bound, 1), "decode_fraction_of_bound": round(dec / bound, 4),
        "encode_GBps": round(nbytes / t_enc / 1e9, 1), "decode_reduce_values_per_s": float(f"{nbytes / 2 / t_red:.4g}"),
        "bit_exact": bool(enc_exact and dec_exact and red_exact),
        "bit_exact_parts": {"encoder_rows": enc_exact, "decoder": dec_exact, "decode_reduce_fold": bool(red_exact)},
        "median_seconds": {"copy": t_copy, "decode": t_dec, "decode_reduce": t_red, "encode": t_enc},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", default=str(REPO / ".kvdump" / "smollm2_kv_v3.pt"))
    ap.add_argument("--gbytes", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--out", default=None, help="default: eval/results/codec_v3_<card>.json (h100, h200)")
    args = ap.parse_args(argv)
    reason = cu.why_unavailable()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    t0 = time.time()
    dev = torch.device("cuda")
    kv = torch.load(args.kv)
    x, b8, b16 = kv["x"].to(dev), kv["b8"].to(dev), kv["b16"].to(dev)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    rows = {}
    for d in (int(v) for v in args.head_dims.split(",")):
        xs, s8, s16 = widen(x, b8, b16, d // 64)
        rows[str(d)] = r = bench_one(xs, s8, s16, args.gbytes, args.reps, flush)
        print(f"d={d}: decode {r['decode_GBps']} GB/s (bound {r['decode_bound_GBps']}, {100 * r['decode_fraction_of_bound']:.1f}%), "
              f"encode {r['encode_GBps']} GB/s, reduce {r['decode_reduce_values_per_s']:.3g} values/s, copy {r['copy_GBps']} GB/s, "
              f"ratio {r['ratio']}, bit-exact {r['bit_exact']}", flush=True)
    commit = os.environ.get("GAAC_COMMIT") or subprocess.run(  # GPU machines get the tree without .git
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    import cuda.core

    result = {
        "per_head_dim": rows,
        "bit_exact": all(r["bit_exact"] for r in rows.values()),
        "data": {"file": Path(args.kv).name, "model": kv.get("model"), "blocks_64x64": int(x.shape[0]),
                 "note": "head_dim 128/256 blocks are 2/4 real SmolLM2 64-channel blocks side by side"},
        "gpu": torch.cuda.get_device_name(dev),
        "commit": commit,
        "command": "python eval/bench_codec_v3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda.core": cuda.core.__version__,
                     "python": platform.python_version()},
        "definitions": __doc__.split("\n\n")[3].strip(),
        "seconds": round(time.time() - t0, 1),
    }
    gpu = result["gpu"]
    card = "h100" if "H100" in gpu else "h200" if "H200" in gpu else gpu.lower().replace(" ", "-")
    out = Path(args.out or REPO / "eval" / "results" / f"codec_v3_{card}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
