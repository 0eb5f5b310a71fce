"""Lab check (not part of the product's test suite): the per-row escape-offset decoder experiment
(``lab/experiments/decode_rowoff.py``) against the reference codec, on the CPU interpreter.
Run from the repository root: ``TRITON_INTERPRET=1 python -m pytest -q lab/test_experiments.py``."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent / "experiments"))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_row_offset_decoder_is_bit_exact(d):
    import decode_rowoff

    assert decode_rowoff._check_cpu_dim(d)
