"""Held-out GAAC format-v3 compression on a real model, every stored byte counted, plus the sizes of the
candidate layouts that were measured against it (docs/FORMAT_V3.md, "Rejected alternatives").

    python eval/compression_v3.py --model smollm2 [--dump .kvdump/smollm2_kv_v3.pt]

Uses the shipped v2 calibration table (its windows carry over to v3), runs the model over held-out
WikiText-2 raw test text, encodes every full block of every layer's K and V with the v3 reference
codec, decodes it and compares int16 bit patterns. Stored bytes per block = its 16-byte-aligned length
(or 2 B/value if stored raw) + an 8-byte block-table entry; the table is counted once per sequence.
``--dump`` also writes a small file of real blocks + bases for the GPU benchmark (never committed).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# (no sys.path insert of the repo root: its kernels/ folder would shadow the PyPI `kernels` that transformers
# 5.25 imports for hub kernels; gaac_hf comes from the install, README command 1)
DATA = REPO.parent / "shared" / "data"

from gaac_hf.codec.v3 import decode_blocks_v3, encode_blocks_v3, stored_bytes  # noqa: E402
from gaac_hf.format.v3 import FORMAT_VERSION, SEGMENT_CHUNKS, GeometryV3, ceil_to  # noqa: E402
from gaac_hf.calibration.v3 import load_table_v3  # noqa: E402


def dense4_bytes(blocks: torch.Tensor, b16: torch.Tensor, g: GeometryV3) -> int:
    """Candidate C: no 3-bit mode: every group 4-bit (dense 4-bit codes, n/2 bytes) unless it does not fit
    the 16-window; those listed like v3's raw groups (2-byte entry + 4-byte raw word) + 8-byte entry."""
    from gaac_hf.codec.v3 import chunk_bases, split_bf16, to_chunks

    e = to_chunks(split_bf16(blocks)[0], g)
    b = chunk_bases(b16, blocks.shape[0], g, "base16")
    off = e - b
    raw = (~((off >= 0) & (off < 16)).all(-1)).reshape(blocks.shape[0], -1).sum(-1)
    nb = ((g.numel + g.numel // 2 + g.segtab_bytes + 6 * raw + 15) // 16) * 16
    return int(torch.where(nb <= g.raw_bytes, nb, g.raw_bytes).sum() + 8 * blocks.shape[0])


def candidate_bytes(modes: torch.Tensor, g: GeometryV3) -> dict:
    """Stored bytes per block (incl. block-table entry) of each candidate layout, from the group modes.

    modes: int32 [N, T, D/8]. Every candidate stores the same sm bytes and 3-bit low codes.
    """
    n = modes.shape[0]
    m = modes.reshape(n, -1)
    n4, nr = (m == 1).sum(-1).to(torch.int64), (m == 2).sum(-1).to(torch.int64)
    fixed = g.numel + 3 * g.numel // 8
    raw_block = torch.full_like(n4, g.raw_bytes)
    # B: the recipe: 2-bit tag plane + v2-style escape bytes (1 per 4-bit, 5 per raw group) +
    #    a u16 escape offset per segment (warp) + 8-byte entry
    b = ceil_to(fixed + g.numel // 32 + 2 * g.segments, 4) + n4 + 5 * nr
    b = (b + 15) // 16 * 16
    # B16: B with groups' modes per 16 values would change shares; not counted here (see doc)
    # v2 as stored today: slot (planes, aligned) + exact escape stream + 8-byte esc_start + 4-byte entry
    from gaac_hf.format import BlockGeometry

    g2 = BlockGeometry(g.block_size, g.head_dim) if g.head_dim in (64, 128, 256) else None
    out = {"B_tagplane_segment_offsets": torch.where(b <= g.raw_bytes, b, raw_block) + 8}
    if g2 is not None:
        v2 = g2.slot_bytes + n4 + 5 * nr + 8
        out["v2"] = torch.where(n4 + 5 * nr <= g2.escape_limit, v2, raw_block) + 4
    return {k: int(v.sum()) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--table", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    ap.add_argument("--eval-text", default=str(DATA / "wikitext-2-raw-v1" / "wiki.test.raw"))
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--eval-max-tokens", type=int, default=32768)
    ap.add_argument("--dump", default=None, help="also write real blocks + bases here (for eval/bench_codec_v3.py)")
    ap.add_argument("--dump-tokens", type=int, default=512)
    ap.add_argument("--full-cache", action="store_true", help="keep every token of sliding-window layers and measure them too")
    ap.add_argument("--name", default="smollm2", help="name in the output file")
    ap.add_argument("--out", default=None, help="default: eval/results/compression_<name>_v3.json")
    args = ap.parse_args(argv)

    from gaac_hf.calibration.collect import run_chunks, split_chunks, tokenize
    from gaac_hf.models import load_named_model

    t0 = time.time()
    model, tok, model_name = load_named_model(args.model, dtype=torch.bfloat16)
    table = load_table_v3(args.table)
    g = table.geometry
    chunks = split_chunks(tokenize(tok, Path(args.eval_text).read_text(encoding="utf-8"), args.eval_max_tokens), args.context, g.block_size)
    tot = {"values": 0, "stored": 0, "blocks": 0, "raw_blocks": 0, "modes": torch.zeros(2, 3, dtype=torch.int64)}
    cand: dict[str, int] = {}
    bit_exact, dump = True, {"x": [], "b8": [], "b16": []}
    seqs = 0
    for ci, keys, values in run_chunks(model, chunks, desc="held-out forward + v3 codec", full_cache=args.full_cache):
        seqs += 1
        for li in range(len(keys)):
            for kind, x in ((0, keys[li]), (1, values[li])):
                h, s, d = x.shape
                if s < args.context:  # a sliding-window layer's cache (GAAC compresses full-attention layers)
                    continue
                nb = s // g.block_size
                blocks = x[:, : nb * g.block_size].reshape(h * nb, g.block_size, d)
                b8, b16 = (b.repeat_interleave(nb, 0) for b in table.bases(li, kind))
                enc = encode_blocks_v3(blocks, b8, b16, g)
                y = decode_blocks_v3(enc.data, b8, b16, g)
                bit_exact &= torch.equal(y.view(torch.int16), blocks.view(torch.int16))
                tot["values"] += blocks.numel()
                tot["stored"] += int(stored_bytes(enc, g).sum())
                tot["blocks"] += blocks.shape[0]
                tot["raw_blocks"] += int((~enc.fits).sum())
                tot["modes"][kind] += torch.bincount(enc.modes.reshape(-1), minlength=3)
                for k, v in candidate_bytes(enc.modes, g).items():
                    cand[k] = cand.get(k, 0) + v
                cand["C_dense_4bit_only"] = cand.get("C_dense_4bit_only", 0) + dense4_bytes(blocks, b16, g)
                if args.dump and ci == 0:
                    keep = torch.arange(h * nb) % nb < args.dump_tokens // g.block_size
                    dump["x"].append(blocks[keep].clone())
                    dump["b8"].append(b8[keep].clone())
                    dump["b16"].append(b16[keep].clone())
    table_bytes = 2 * table.base8.numel() * seqs
    values = tot["values"]
    ratio = lambda stored: round(2 * values / (stored + table_bytes), 5)  # noqa: E731
    modes = tot["modes"]
    shares = {k: {n: round(int(modes[i, j]) / int(modes[i].sum()), 6) for j, n in enumerate(("3bit", "4bit", "raw"))} for i, k in ((0, "K"), (1, "V"))}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "model": model_name,
        "format_version": FORMAT_VERSION,
        "ratio_with_overhead": ratio(tot["stored"]),
        "ratio": ratio(tot["stored"]),
        "bits_per_element": round(8 * (tot["stored"] + table_bytes) / values, 4),
        "bit_exact": bool(bit_exact),
        "mode_shares": shares,
        "raw_block_share": round(tot["raw_blocks"] / tot["blocks"], 6),
        "blocks": tot["blocks"],
        "values": values,
        "geometry": g.to_dict() | {"segments": g.segments, "fixed_bytes": g.fixed_bytes, "raw_bytes": g.raw_bytes},
        "candidates_ratio_with_overhead": {"A_exception_list (chosen)": ratio(tot["stored"])} | {k: ratio(v) for k, v in cand.items()},
        "definitions": {
            "ratio": "BF16 bytes of all full blocks / stored bytes: each block's 16-byte-aligned v3 length (or 2 B/value if "
                     "stored raw) + an 8-byte block-table entry, + the calibration table once per evaluated sequence",
            "bit_exact": "decode(encode(x)) has the same int16 bits as x for every block",
        },
        "calibration": {"table": str(Path(args.table).resolve().relative_to(REPO)) if Path(args.table).resolve().is_relative_to(REPO) else args.table,
                        "upgraded_from": table.meta.get("upgraded_from"), "text": table.meta.get("text"), "context": table.meta.get("context")},
        "evaluation": {"text": "wikitext-2-raw-v1/wiki.test.raw", "sequences": seqs, "context": args.context, "tokens": int(chunks.numel()),
                       "full_cache": args.full_cache},
        "commit": commit,
        "command": "python eval/compression_v3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seconds": round(time.time() - t0, 1),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    out = Path(args.out or REPO / "eval" / "results" / f"compression_{args.name}_v3.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if args.dump:
        Path(args.dump).parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: torch.cat(v) for k, v in dump.items()} | {"model": model_name, "segment_chunks": SEGMENT_CHUNKS}, args.dump)
    print(json.dumps({k: result[k] for k in ("ratio", "bits_per_element", "bit_exact", "mode_shares", "candidates_ratio_with_overhead")}, indent=1))
    return 0 if bit_exact else 1


if __name__ == "__main__":
    sys.exit(main())
