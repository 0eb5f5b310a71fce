"""Standalone GAAC codec throughput on one GPU: Triton encoder / decoder vs the PyTorch reference.

    python eval/bench_codec.py --out eval/results/codec_h200.json

GB/s counts BF16 bytes (encoder input, decoder output), as SplitZip and the issue's targets do.
Sizes: one block (latency), 1,024 blocks, and a whole Qwen3-8B layer's K at 64K (8 heads x 1,024
blocks of 64 x 128 = 134 MB). Data: synthetic KV-like K (``gaac_hf.calibration.synthetic``).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

import torch
import triton

from gaac_hf.codec import decode_blocks, encode_blocks, pack_escapes
from gaac_hf.format import BlockGeometry
from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.triton.decode import decode_blocks_triton
from gaac_hf.kernels.triton.encode import append_escapes_triton, encode_blocks_triton
from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402


def gpu_us(fn, reps: int = 10) -> float:
    """GPU busy time per call (the profiler's kernel time, after one warm-up call)."""
    return harness.gpu_busy_us(fn, reps, warmup=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="eval/results/codec_h200.json")
    ap.add_argument("--quick", action="store_true", help="whole-layer sizes only, no PyTorch-reference timings")
    ap.add_argument("--heads", type=int, default=8, help="kv-heads of the whole-layer K (x 1,024 blocks of 64 tokens)")
    ap.add_argument("--decode-configs", default="", help="extra fast-decoder launches 'warps,tile_tokens;...' "
                    "(each checked bit for bit and timed as decode_fast_w{warps}_ts{tile})")
    args = ap.parse_args()
    dev = "cuda"
    rows = []
    for d in (128, 64, 256):
        geom = BlockGeometry(block_size=64, head_dim=d)
        heads = args.heads
        x = synthetic_kv((1, heads, 65536, d), "k", seed=d, device=dev)
        b8, b16 = calibrate(x)
        blocks = x[0].reshape(heads * 1024, 64, d)
        hb = torch.arange(heads, device=dev).repeat_interleave(1024)
        B8, B16 = b8[hb].contiguous(), b16[hb].contiguous()
        for n in ((1, 1024, heads * 1024) if d == 128 and not args.quick else (heads * 1024,)):
            xb, c8, c16 = blocks[:n].contiguous(), B8[:n], B16[:n]
            ref = encode_blocks(xb, c8, c16, geom)
            got = encode_blocks_triton(xb, c8, c16, geom)
            gotg = encode_blocks_triton(xb, c8, c16, geom, fast=True)
            # the cache's path: escape rows as wide as the escape limit, then packed into the heap
            rows_ = encode_blocks_triton(xb, c8, c16, geom, fast=True, escape_width=geom.escape_limit)
            heap = torch.empty(int(ref.escape_len[ref.fits].sum()) + 1, dtype=torch.uint8, device=dev)
            used = torch.zeros(1, dtype=torch.int64, device=dev)
            start = append_escapes_triton(rows_, heap, used)
            want_heap, want_start = pack_escapes(ref.escapes[ref.fits], ref.escape_len[ref.fits])
            ok_enc = bool(torch.equal(got.slots, ref.slots) and torch.equal(got.escape_len, ref.escape_len)
                          and torch.equal(got.escapes, ref.escapes)
                          and torch.equal(gotg.slots, ref.slots) and torch.equal(gotg.escapes, ref.escapes)
                          and torch.equal(rows_.slots, ref.slots) and torch.equal(heap[: want_heap.numel()], want_heap)
                          and torch.equal(start[ref.fits], want_start))
            fit = ref.fits
            sl, st8, st16 = ref.slots[fit].contiguous(), c8[fit].contiguous(), c16[fit].contiguous()
            esc = (heap, start[fit].contiguous())
            dec = decode_blocks_triton(sl, esc, st8, st16, geom)
            fast_dec = decode_blocks_triton(sl, esc, st8, st16, geom, fast=True)
            ok_dec = bool(torch.equal(dec.view(torch.int16), xb[fit].view(torch.int16))
                          and torch.equal(fast_dec.view(torch.int16), xb[fit].view(torch.int16)))
            slots = torch.empty_like(got.slots)
            out = torch.empty_like(dec)
            heap2 = torch.empty_like(heap)

            def to_heap():
                e = encode_blocks_triton(xb, c8, c16, geom, slots=slots, fast=True, escape_width=geom.escape_limit)
                used.zero_()
                append_escapes_triton(e, heap2, used)

            t = {
                "encode_triton": triton.testing.do_bench(lambda: encode_blocks_triton(xb, c8, c16, geom, slots=slots), return_mode="median"),
                "encode_triton_groups": triton.testing.do_bench(lambda: encode_blocks_triton(xb, c8, c16, geom, slots=slots, fast=True, escape_width=geom.escape_limit), return_mode="median"),
                "encode_to_heap": triton.testing.do_bench(to_heap, return_mode="median"),
                "decode_triton": triton.testing.do_bench(lambda: decode_blocks_triton(sl, esc, st8, st16, geom, out=out), return_mode="median"),
                "decode_triton_fast": triton.testing.do_bench(lambda: decode_blocks_triton(sl, esc, st8, st16, geom, out=out, fast=True), return_mode="median"),
            }
            # GPU time alone (sum of kernel durations, torch.profiler): free of the wrapper's host time,
            # which on a slow host can exceed the kernels' at these sizes
            gpu = {k: gpu_us(f) for k, f in (
                ("encode_triton_groups", lambda: encode_blocks_triton(xb, c8, c16, geom, slots=slots, fast=True, escape_width=geom.escape_limit)),
                ("encode_to_heap", to_heap),
                ("decode_triton_fast", lambda: decode_blocks_triton(sl, esc, st8, st16, geom, out=out, fast=True)))}
            for cfg in filter(None, args.decode_configs.split(";")):
                w, ts = (int(x) for x in cfg.split(","))
                name = f"decode_fast_w{w}_ts{ts}"
                f = (lambda w=w, ts=ts: decode_blocks_triton(sl, esc, st8, st16, geom, out=out, fast=True, launch=LaunchConfig(tile_tokens=ts, num_warps=w)))
                out.fill_(float("nan"))
                f()
                ok_dec = ok_dec and bool(torch.equal(out.view(torch.int16), xb[fit].view(torch.int16)))
                t[name] = triton.testing.do_bench(f, return_mode="median")
                gpu[name] = gpu_us(f)
            if not args.quick:
                t["encode_torch"] = triton.testing.do_bench(lambda: encode_blocks(xb, c8, c16, geom), return_mode="median", rep=40)
                t["decode_torch"] = triton.testing.do_bench(lambda: decode_blocks(sl, esc, st8, st16, geom, validate=False), return_mode="median", rep=40)
            nbytes = xb.numel() * 2
            row = dict(head_dim=d, blocks=n, bf16_bytes=nbytes, format_version=2, fits=float(ref.fits.float().mean()),
                       escape_bytes_per_block=float(ref.escape_len.float().mean()),
                       us={k: v * 1e3 for k, v in t.items()},
                       gbps={k: (dec.numel() * 2 if k.startswith("decode") else nbytes) / (v * 1e-3) / 1e9 for k, v in t.items()},
                       encode_exact=ok_enc, decode_exact=ok_dec, gpu_us=gpu,
                       gpu_gbps={k: (dec.numel() * 2 if k.startswith("decode") else nbytes) / (v * 1e-6) / 1e9 for k, v in gpu.items()})
            rows.append(row)
            print(f"D={d:3d} blocks={n:5d} exact={ok_enc}/{ok_dec} fits={row['fits']:.4f} " +
                  " ".join(f"{k} {row['gbps'][k]:8.1f} GB/s ({row['us'][k]:.1f} us)" for k in t), flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), versions=dict(torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version()), command=" ".join(["python"] + sys.argv),
                method="median of triton.testing.do_bench (L2 flushed before each call); GB/s of BF16 bytes", rows=rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    harness.write_result(args.out, meta)


if __name__ == "__main__":
    main()
