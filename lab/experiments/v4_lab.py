"""The frame the v4 lab experiments share: ``--out``, rows measured one at a time, the file (with the harness's
provenance) rewritten after every row so that a call cut off at its time limit still returns what it measured.

    v4_lab.run(measure)   # measure(dev) yields row dicts
"""
import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import harness  # noqa: E402


def run(measure, device: str = "cuda", argv=None) -> list:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rows = []
    for row in measure(torch.device(device)):
        rows.append(row)
        Path(a.out).write_text(json.dumps(dict(harness.provenance(argv=sys.argv), rows=rows), indent=1))
    return rows
