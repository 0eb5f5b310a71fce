"""Ratio and exactness of the register-tile layouts (format.py, format4.py) on real model K/V (CPU).

    python lab/experiments/regtile/ratio_real.py [--model smollm2] [--eval-max-tokens 16384] --out lab/results/X.json

Same protocol as eval/compression_v3.py (held-out WikiText-2 raw test text, the shipped calibration table's
windows, every full block of every full-attention layer): each (layer, head) is encoded, decoded and compared
bit for bit; stored bytes = tiles of fitting blocks + 2 B/value for blocks stored BF16 + a 4-byte table entry
per block + the bases once per sequence.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import format as F3  # noqa: E402
import format4 as F4  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--table", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    ap.add_argument("--eval-text", default=str(REPO.parent / "shared" / "data" / "wikitext-2-raw-v1" / "wiki.test.raw"))
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--eval-max-tokens", type=int, default=16384)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from gaac_hf.calibration.collect import run_chunks, split_chunks, tokenize
    from gaac_hf.calibration.v3 import load_table_v3
    from gaac_hf.models import load_named_model

    t0 = time.time()
    model, tok, name = load_named_model(a.model, dtype=torch.bfloat16)
    table = load_table_v3(a.table)
    T = table.geometry.block_size
    assert T == F4.BLOCK_T
    chunks = split_chunks(tokenize(tok, Path(a.eval_text).read_text(encoding="utf-8"), a.eval_max_tokens), a.context, T)
    acc = {m.__name__: dict(stored=0, blocks=0, bf16_blocks=0, raw_groups=0, groups=0, exact=True, per_kind={})
           for m in (F3, F4)}
    values = seqs = 0
    for _, keys, vals in run_chunks(model, chunks, desc="held-out forward + register-tile codecs"):
        seqs += 1
        for li in range(len(keys)):
            for kind, x in ((0, keys[li]), (1, vals[li])):
                h, s, d = x.shape
                if s < a.context:
                    continue
                nb = s // T
                b8s, b16s = table.bases(li, kind)
                for hh in range(h):
                    blocks = x[hh, : nb * T].reshape(nb, T, d).contiguous()
                    values += blocks.numel()
                    for m in (F3, F4):
                        r = acc[m.__name__]
                        enc = m.encode(blocks, b8s[hh], b16s[hh], "kv"[kind])
                        dec = m.decode(enc.data[enc.fits], b8s[hh], b16s[hh], d, "kv"[kind])
                        r["exact"] &= bool(torch.equal(dec.view(torch.int16), blocks[enc.fits].view(torch.int16)))
                        nf = int(enc.fits.sum())
                        r["stored"] += nf * m.Geometry(d).block_bytes + (nb - nf) * T * d * 2 + 4 * nb
                        r["blocks"] += nb
                        r["bf16_blocks"] += nb - nf
                        r["raw_groups"] += int((enc.modes == 2).sum())
                        r["groups"] += enc.modes.numel()
                        pk = r["per_kind"].setdefault("KV"[kind], dict(blocks=0, bf16_blocks=0, raw_groups=0, groups=0))
                        pk["blocks"] += nb
                        pk["bf16_blocks"] += nb - nf
                        pk["raw_groups"] += int((enc.modes == 2).sum())
                        pk["groups"] += enc.modes.numel()
    table_bytes = 2 * table.base8.numel() * seqs
    res = dict(model=name, values=values, sequences=seqs, context=a.context, tokens=int(chunks.numel()),
               layouts={}, commit=subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                                 capture_output=True, text=True).stdout.strip(),
               command="python lab/experiments/regtile/ratio_real.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               versions=dict(torch=torch.__version__, transformers=__import__("transformers").__version__),
               definitions="ratio = BF16 bytes of all full blocks / (tiles of fitting blocks + 2 B/value for blocks "
                           "stored BF16 + 4 B table entry per block + bases once per sequence)")
    for k, r in acc.items():
        res["layouts"][k] = dict(ratio=round(2 * values / (r["stored"] + table_bytes), 5), bit_exact=r["exact"],
                                 bf16_block_share=round(r["bf16_blocks"] / r["blocks"], 6),
                                 raw_group_share=round(r["raw_groups"] / r["groups"], 6),
                                 per_kind={kk: dict(bf16_block_share=round(v["bf16_blocks"] / v["blocks"], 6),
                                                    raw_group_share=round(v["raw_groups"] / v["groups"], 6))
                                           for kk, v in r["per_kind"].items()})
    res["seconds"] = round(time.time() - t0, 1)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["layouts"], indent=1))
    return 0 if all(r["exact"] for r in acc.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
