"""Held-out GAAC compression of FP8 KV caches (format v3 FP8 tiles, E4M3 and E5M2) on a real model, every
stored byte counted, plus the code widths and scale conventions measured against the chosen ones
(docs/FORMAT_V3.md, "FP8 tiles").

    python eval/compression_fp8.py --model smollm2            # -> eval/results/compression_fp8_smollm2.json
    python eval/compression_fp8.py --model gemma3 --context 2048 --eval-max-tokens 8192 --name gemma3-270m

Calibration (WikiText-2 ``valid.txt``): the model runs over the text; per layer and K/V the FP8 scale is
``amax / max_finite`` over the calibration K/V (a static per-tensor scale, like vLLM's ``k_scale`` /
``v_scale``; ``--per-head`` measures per-kv-head scales), the K/V are converted exactly as an FP8 cache
converts them (``(x.float() / scale).to(float8)``) and per-channel windows are chosen from the exponent
histograms of the FP8 codes. Evaluation (held-out ``wiki.test.raw``): the same conversion with the same
scales, every full block of every full-attention layer's K and V encoded by the reference codec
(``gaac_hf.codec.fp8``), decoded from a pool and compared byte for byte.

Ratios are over FP8 (1 byte per value): FP8 bytes of all full blocks / (each block's stored length, or
T*D bytes if stored raw, + an 8-byte block-table entry per block, + per evaluated sequence the windows
(2 bytes per channel) and the scales (4 bytes each)).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# (no sys.path insert of the repo root: its kernels/ folder would shadow the PyPI `kernels` that transformers
# 5.25 imports for hub kernels; gaac_hf comes from the install, README command 1)
sys.path.insert(0, str(REPO / "eval"))

import harness  # noqa: E402

from gaac_hf.codec.fp8 import (  # noqa: E402
    choose_windows_fp8, decode_pool_fp8, encode_blocks_fp8, exponent_histogram_fp8, quantize_fp8, split_fp8,
)
from gaac_hf.codec.v3 import pack_blocks, stored_bytes, to_chunks  # noqa: E402
from gaac_hf.format.fp8 import NARROW_BITS, TORCH_DTYPES, WIDE_BITS, GeometryFP8  # noqa: E402

DTYPES = ("fp8_e4m3", "fp8_e5m2")
#: (narrow bits, wide bits) measured besides the chosen (3, 4); wide = exponent bits means "no raw mode"
CANDIDATES = [(1, 2), (1, 3), (2, 3), (2, 4), (3, 4), (3, 5), (2, 5), (4, 5)]


def fp8_dtype(dtype: str) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES[dtype])


def fmax(dtype: str) -> float:
    return torch.finfo(fp8_dtype(dtype)).max


def candidate_bytes(e: torch.Tensor, cal_hist: torch.Tensor, g: GeometryFP8, n_bits: int, w_bits: int) -> int:
    """Stored bytes (incl. 8-byte block entries) of a layout like the chosen one with other code widths.

    e: int32 ``[N, T, D]`` exponent fields of held-out blocks of one (layer, K/V) tensor, all of one kv-head
    per ``cal_hist`` row: ``cal_hist`` int64 ``[N, D, 2**E]`` (the calibration histogram of each block's head).
    Per block: sign/mantissa plane + n_bits per value + segment table; per wide group a 2-byte entry plus
    ceil(8 (w - n - 1) / 8) bytes of further high bits; per raw group ceil(8 (E - w) / 8) bytes; 16-byte
    aligned; T * D bytes if that is not smaller. For (3, 4) this is the codec's own length (checked).
    """
    E = g.exp_bits
    if w_bits > E or n_bits >= w_bits:
        raise ValueError(f"no such candidate: narrow {n_bits}, wide {w_bits} for {g.dtype}")
    c = torch.cat([torch.zeros_like(cal_hist[..., :1]), cal_hist.cumsum(-1)], -1)
    bases = [(c[..., 1 << b:] - c[..., :-(1 << b)]).argmax(-1) for b in (n_bits, w_bits)]  # [N, D]
    n = e.shape[0]
    ge = to_chunks(e, g)  # [N, C, 4, 8]
    on = ge - bases[0].reshape(n, 1, g.cols, 1, 8).expand(n, g.bands, g.cols, 1, 8).reshape(n, g.chunks, 1, 8)
    ow = ge - bases[1].reshape(n, 1, g.cols, 1, 8).expand(n, g.bands, g.cols, 1, 8).reshape(n, g.chunks, 1, 8)
    fit_n = ((on >= 0) & (on < (1 << n_bits))).all(-1)
    fit_w = ((ow >= 0) & (ow < (1 << w_bits))).all(-1) if w_bits < E else torch.ones_like(fit_n)
    wide = (~fit_n).reshape(n, -1).sum(-1)
    raw = (~fit_n & ~fit_w).reshape(n, -1).sum(-1)
    fixed = g.code_offset + g.numel * n_bits // 8 + g.segtab_bytes
    extra_wide = -(-8 * (w_bits - n_bits - 1) // 8)
    extra_raw = -(-8 * (E - w_bits) // 8)
    nb = (fixed + (2 + extra_wide) * wide + extra_raw * raw + 15) // 16 * 16
    return int(torch.where(nb <= g.raw_bytes, nb, g.raw_bytes).sum() + 8 * n)


def collect(model, chunks, full_cache: bool):
    """[(keys, values)] per chunk: lists over layers of BF16 ``[Hkv, S, D]``."""
    from gaac_hf.calibration.collect import run_chunks

    return [(k, v) for _, k, v in run_chunks(model, chunks, desc="forward", full_cache=full_cache)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calib-text", default=None, help="default: WikiText-2 valid.txt (gaac_hf.data)")
    ap.add_argument("--eval-text", default=None, help="default: WikiText-2 raw wiki.test.raw (gaac_hf.data)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--calib-tokens", type=int, default=8192)
    ap.add_argument("--eval-max-tokens", type=int, default=16384)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--per-head", action="store_true", help="per-kv-head scales instead of per tensor")
    ap.add_argument("--scale", choices=("static", "prompt"), default="static",
                    help="static: the calibration scale (vLLM k_scale/v_scale); prompt: each sequence's own amax scale, as "
                         "transformers' fp8 cache sets it at the prefill, with the windows shifted by round(log2(s_cal / s))")
    ap.add_argument("--no-candidates", action="store_true", help="skip the code-width candidates (faster)")
    ap.add_argument("--name", default=None, help="name in the output file (default: the --model)")
    ap.add_argument("--out", default=None, help="default: eval/results/compression_fp8_<name>.json")
    args = ap.parse_args(argv)

    from gaac_hf.calibration.collect import split_chunks, tokenize
    from gaac_hf.data import data_file
    from gaac_hf.models import load_named_model

    t0 = time.time()
    torch.manual_seed(0)
    model, tok, model_name = load_named_model(args.model, dtype=torch.bfloat16)
    cal_path = Path(args.calib_text or data_file("wikitext-2-v1/valid.txt"))
    ev_path = Path(args.eval_text or data_file("wikitext-2-raw-v1/wiki.test.raw"))
    t = args.block_size
    cal_chunks = split_chunks(tokenize(tok, cal_path.read_text(encoding="utf-8"), args.calib_tokens), args.context, t)
    ev_chunks = split_chunks(tokenize(tok, ev_path.read_text(encoding="utf-8"), args.eval_max_tokens), args.context, t)
    cal = collect(model, cal_chunks, full_cache=False)
    n_layers = len(cal[0][0])

    results: dict = {}
    ev = collect(model, ev_chunks, full_cache=False)
    for dtype in DTYPES:
        # ---- calibration: static scales, windows from the FP8 codes
        scales, hists = {}, {}
        for li in range(n_layers):
            for kind in (0, 1):
                xs = [c[kind][li] for c in cal if c[kind][li].shape[1] >= args.context]
                if not xs:
                    continue  # a sliding-window layer (GAAC compresses full-attention layers)
                x = torch.cat(xs, 1)  # [H, S, D]
                a = x.abs().float()
                s = (a.amax(dim=(1, 2)) if args.per_head else a.amax()) / fmax(dtype)
                s = s.clamp(min=torch.finfo(torch.float32).tiny)
                g = GeometryFP8(t, x.shape[-1], dtype)
                scales[li, kind] = s
                hists[li, kind] = exponent_histogram_fp8(quantize_fp8(x, s, dtype), g)  # [H, D, 2**E]
        # ---- held-out: convert with the calibrated scales, encode, decode, count
        tot = {"values": 0, "stored": 0, "blocks": 0, "raw_blocks": 0, "modes": torch.zeros(2, 3, dtype=torch.int64),
               "nonfinite_codes": 0}
        cand = {c: 0 for c in CANDIDATES}
        bit_exact, model_matches = True, True
        for keys, values in ev:
            for (li, kind), s in scales.items():
                x = (keys, values)[kind][li]
                h, S, d = x.shape
                g = GeometryFP8(t, d, dtype)
                base_n, base_w = choose_windows_fp8(hists[li, kind], g)  # [H, D]
                if args.scale == "prompt":  # the sequence's own scale; windows follow the exponent shift it causes
                    s_cal = s
                    a = x.abs().float()
                    s = ((a.amax(dim=(1, 2)) if args.per_head else a.amax()) / fmax(dtype)).clamp(min=torch.finfo(torch.float32).tiny)
                    shift = torch.round(torch.log2(s_cal / s)).to(torch.int32).reshape(-1, 1).expand(h, d)
                    base_n = (base_n.to(torch.int32) + shift).clamp(0, g.max_base_narrow).to(torch.uint8)
                    base_w = (base_w.to(torch.int32) + shift).clamp(0, g.max_base_wide).to(torch.uint8)
                codes = quantize_fp8(x, s, dtype)
                nb = S // t
                blocks = codes[:, : nb * t].reshape(h * nb, t, d)
                bn, bw = base_n.repeat_interleave(nb, 0), base_w.repeat_interleave(nb, 0)
                enc = encode_blocks_fp8(blocks, bn, bw, g)
                pool, entries = pack_blocks(enc, blocks)
                y = decode_pool_fp8(pool, entries, bn, bw, g)
                bit_exact &= torch.equal(y, blocks)
                stored = int(stored_bytes(enc, g).sum())
                tot["values"] += blocks.numel()
                tot["stored"] += stored
                tot["blocks"] += blocks.shape[0]
                tot["raw_blocks"] += int((~enc.fits).sum())
                tot["modes"][kind] += torch.bincount(enc.modes.reshape(-1), minlength=3)
                fl = blocks.view(fp8_dtype(dtype)).float()
                tot["nonfinite_codes"] += int((~torch.isfinite(fl)).sum())
                if args.scale == "static" and not args.no_candidates:  # candidates' windows: the calibration histograms
                    e = split_fp8(blocks, g)[0]
                    hist_b = hists[li, kind].repeat_interleave(nb, 0)
                    for c in CANDIDATES:
                        if c[1] <= g.exp_bits:
                            cand[c] += candidate_bytes(e, hist_b, g, *c)
                    model_matches &= candidate_bytes(e, hist_b, g, NARROW_BITS, WIDE_BITS) == stored
        seqs = len(ev)
        n_scales = sum(int(s.numel()) for s in scales.values())
        n_channels = sum(int(hh.shape[0] * hh.shape[1]) for hh in hists.values())
        side = seqs * (2 * n_channels + 4 * n_scales)
        values = tot["values"]
        ratio = lambda stored: round(values / (stored + side), 5)  # noqa: E731
        modes = tot["modes"]
        shares = {k: {nm: round(int(modes[i, j]) / max(int(modes[i].sum()), 1), 6) for j, nm in enumerate(("narrow", "wide", "raw"))}
                  for i, k in ((0, "K"), (1, "V"))}
        results[dtype] = {
            "ratio_over_fp8": ratio(tot["stored"]),
            "ratio_over_bf16": round(2 * ratio(tot["stored"]), 5),
            "bits_per_value": round(8 * (tot["stored"] + side) / values, 4),
            "bit_exact": bool(bit_exact),
            "mode_shares": shares,
            "raw_block_share": round(tot["raw_blocks"] / tot["blocks"], 6),
            "blocks": tot["blocks"], "values": values, "side_bytes": side,
            "nonfinite_codes": tot["nonfinite_codes"],
            "size_model_equals_codec": bool(model_matches) if args.scale == "static" and not args.no_candidates else None,
            "candidates_ratio": {f"narrow{a}_wide{b}" + (" (chosen)" if (a, b) == (NARROW_BITS, WIDE_BITS) else ""):
                                 ratio(v) for (a, b), v in cand.items() if v},
        }
        print(dtype, {k: results[dtype][k] for k in ("ratio_over_fp8", "bits_per_value", "bit_exact", "mode_shares")}, flush=True)

    name = args.name or args.model
    out = Path(args.out or REPO / "eval" / "results" / f"compression_fp8_{name}.json")
    data = {
        "model": model_name,
        "ratio_e4m3": results["fp8_e4m3"]["ratio_over_fp8"],
        "ratio_e5m2": results["fp8_e5m2"]["ratio_over_fp8"],
        "bit_exact": all(r["bit_exact"] for r in results.values()),
        "per_dtype": results,
        "scale": {"granularity": "per kv-head" if args.per_head else "per tensor (layer, K/V)",
                  "source": "calibration K/V, static (vLLM k_scale / v_scale)" if args.scale == "static" else
                            "each held-out sequence's own K/V (transformers Fp8QuantizedLayer at prefill); windows shifted by "
                            "round(log2(calibration scale / scale))",
                  "value": "amax(|K/V|) / max finite", "conversion": "(x.float() / scale).to(float8_e4m3fn | float8_e5m2)"},
        "geometry": {"block_size": t, "narrow_bits": NARROW_BITS, "wide_bits": WIDE_BITS, "format": "v3 FP8 tiles"},
        "definitions": {
            "ratio_over_fp8": "FP8 bytes of all full blocks / (stored block bytes (16-byte aligned, or T*D if stored raw) + 8-byte "
                              "block-table entry per block + per evaluated sequence 2 window bytes per channel and 4 bytes per scale)",
            "candidates_ratio": "the same count for other (narrow, wide) code widths (windows chosen the same way), from the group "
                                "modes of the same held-out blocks; size_model_equals_codec checks the count on the chosen widths",
            "bit_exact": "decode_pool_fp8(pack_blocks(encode_blocks_fp8(codes))) has the same uint8 codes for every block",
        },
        "calibration": {"text": str(cal_path.name), "tokens": int(cal_chunks.numel()), "context": args.context},
        "evaluation": {"text": str(ev_path.name), "sequences": len(ev), "tokens": int(ev_chunks.numel()), "context": args.context},
        "seconds": round(time.time() - t0, 1),
    }
    shapes = {"layers": n_layers, "context": args.context, "block_size": t}
    harness.write_result(out, data, shapes=shapes)
    print(f"wrote {out}: ratio_e4m3 {data['ratio_e4m3']} ratio_e5m2 {data['ratio_e5m2']} bit_exact {data['bit_exact']}")
    return 0 if data["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
