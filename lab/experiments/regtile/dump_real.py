"""Real K/V for the register-tile GPU bench (CPU; the GPU image has no model weights): one layer of SmolLM2's
K and V over held-out WikiText-2 test text, 8K-token sequences concatenated along the sequence axis, with that
layer's shipped calibration bases. Written to .kvdump/ (ignored; carried to the device, never committed).

    python lab/experiments/regtile/dump_real.py [--layer 15] [--tokens 32768] [--out .kvdump/regtile_real_smollm2.pt]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--out", default=str(REPO / ".kvdump" / "regtile_real_smollm2.pt"))
    a = ap.parse_args(argv)
    from gaac_hf.calibration.collect import run_chunks, split_chunks, tokenize
    from gaac_hf.calibration.v3 import load_table_v3
    from gaac_hf.models import load_named_model

    model, tok, name = load_named_model("smollm2", dtype=torch.bfloat16)
    table = load_table_v3(REPO / "calibration_data" / "smollm2-135m.safetensors")
    text = (REPO.parent / "shared" / "data" / "wikitext-2-raw-v1" / "wiki.test.raw").read_text(encoding="utf-8")
    chunks = split_chunks(tokenize(tok, text, a.tokens), a.context, 64)
    ks, vs = [], []
    for _, keys, values in run_chunks(model, chunks, desc=f"held-out forward, layer {a.layer}"):
        ks.append(keys[a.layer].clone())
        vs.append(values[a.layer].clone())
    k, v = torch.cat(ks, 1)[None], torch.cat(vs, 1)[None]  # [1, Hkv, S, D]
    (b8k, b16k), (b8v, b16v) = table.bases(a.layer, 0), table.bases(a.layer, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(k=k, v=v, b8k=b8k, b16k=b16k, b8v=b8v, b16v=b16v, model=name, layer=a.layer,
                    text="wikitext-2-raw-v1/wiki.test.raw", context=a.context), a.out)
    print(f"{a.out}: k {tuple(k.shape)} v {tuple(v.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
