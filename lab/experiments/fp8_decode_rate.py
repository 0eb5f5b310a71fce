"""Lab (session 39, issue 18): how fast the FP8-tile CUDA decoder turns compressed FP8 blocks back into codes on
this GPU, against the rate an FP8 attention kernel streams plain FP8 codes from HBM.

    python lab/experiments/fp8_decode_rate.py --out FILE.json [--kv .kvdump/smollm2_kv_v3.pt]

Data: the real SmolLM2 K/V blocks of ``.kvdump/smollm2_kv_v3.pt`` (BF16 [N, 64, 64]), converted as an FP8 cache
converts them (one amax scale per 64-channel block set, saturating), windows from the codes' own exponent
histogram, each block's own (oracle windows: the ratio is an upper bound; the timing is what matters), each block set widened to head_dim 128 like bench_codec_v3. The
pool is tiled past L2 (~--gbytes of FP8 codes), L2 flushed before each timing, median of --reps CUDA-event timings
(eval/bench_codec_v3.py's ``timed``). Per dtype: decoder codes/s; its bandwidth bound (it reads 1 / ratio and writes 1
byte per code, at the byte rate of a device copy of the same bytes); the codes/s an FP8 attention kernel streams at
that byte rate (one byte per code). A decoder below its bound is issue-limited: its rate then caps any fused
kernel that decodes the same way.
Bit-exactness of the decode is checked on the untiled set against the input codes.

Why: issue 18's fused FP8+GAAC kernel has to beat an FP8 baseline that streams ~HBM-rate codes; if the decoder
alone (no attention work) is slower than that stream, so is any fused kernel of its structure."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default=str(REPO / ".kvdump" / "smollm2_kv_v3.pt"))
    ap.add_argument("--gbytes", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from bench_codec_v3 import tile_pool, timed, widen

    from gaac_hf.codec.fp8 import choose_windows_fp8, exponent_histogram_fp8, fp8_scale, quantize_fp8
    from gaac_hf.codec.v3 import pack_blocks
    from gaac_hf.format.fp8 import GeometryFP8
    from gaac_hf.kernels.cuda import codec_fp8 as cu

    reason = cu.why_unavailable()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    dev = torch.device("cuda")
    kv = torch.load(args.kv)
    x16 = kv["x"]  # BF16 [N, 64, 64]
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    rows = {}
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        codes = quantize_fp8(x16, fp8_scale(x16, dtype), dtype, saturate=True)  # uint8 [N, 64, 64]
        xw, _, _ = widen(codes, kv["b8"], kv["b16"], 2)  # [N/2, 64, 128]: two real blocks side by side
        g = GeometryFP8(64, 128, dtype)
        bn, bw = choose_windows_fp8(exponent_histogram_fp8(xw, g), g)  # [N, 128]: each block's own windows
        bn, bw = bn.to(dev), bw.to(dev)
        xd = xw.to(dev)
        enc = cu.encode_blocks_fp8_cuda(xd, bn, bw, g)
        pool, entries = pack_blocks(type(enc)(enc.data.cpu(), enc.nbytes.cpu(), enc.fits.cpu(), enc.modes), xw)
        pool, entries = pool.to(dev), entries.to(dev)
        got = cu.decode_pool_fp8_cuda(pool, entries, bn, bw, g)
        exact = bool(torch.equal(got, xd))
        times = max(1, int(args.gbytes * 2**30 / xd.numel()))
        bigpool, bigent = tile_pool(pool, entries, times)
        out = torch.empty(bigent.numel(), 64, 128, dtype=torch.uint8, device=dev)
        bnt, bwt = bn.repeat(times, 1), bw.repeat(times, 1)  # the tiled blocks' bases
        tables = cu.pair_tables(bnt, bwt, g)
        src = xd.repeat(times, 1, 1)
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src), args.reps, flush)
        t_dec = timed(lambda: cu.decode_pool_fp8_cuda(bigpool, bigent, bnt, bwt, g, out=out, tables=tables), args.reps, flush)
        n = out.numel()
        ratio = xd.numel() / (pool.numel() + 8 * entries.numel())
        rows[dtype] = r = {
            "codes": n, "ratio_over_fp8": round(ratio, 4), "bit_exact": exact,
            "decode_codes_per_s": round(n / t_dec, -9), "copy_GBps": round(2 * n / t_copy / 1e9, 1),
            # the decoder reads n / ratio and writes n bytes: its bandwidth bound at the copy's byte rate
            "decode_bound_codes_per_s": round(2 * n / t_copy / (1 + 1 / ratio), -9),
            # an FP8 attention kernel reading one byte per code at the copy's byte rate
            "hbm_stream_codes_per_s": round(2 * n / t_copy, -9),
            "decode_over_hbm_stream": round(t_copy / (2 * t_dec), 3),
            "median_seconds": {"copy": t_copy, "decode": t_dec},
        }
        print(f"{dtype}: decode {r['decode_codes_per_s']:.3g} codes/s (bound {r['decode_bound_codes_per_s']:.3g}), HBM stream {r['hbm_read_codes_per_s']:.3g} codes/s "
              f"(x{r['decode_over_hbm_stream']}), ratio {r['ratio_over_fp8']}, bit-exact {exact}", flush=True)
    result = {"rows": rows, "gpu": torch.cuda.get_device_name(dev), "commit": os.environ.get("GAAC_COMMIT"),
              "command": "python " + " ".join(sys.argv), "torch": torch.__version__, "data": Path(args.kv).name}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if all(r["bit_exact"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
