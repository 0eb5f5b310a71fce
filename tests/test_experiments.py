"""The experiment that decides the next format step stays runnable and exact: the per-row escape-offset
decoder (``eval/experiments/decode_rowoff.py``) against the reference codec, on the CPU interpreter."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval" / "experiments"))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_row_offset_decoder_is_bit_exact(d):
    import decode_rowoff

    assert decode_rowoff._check_cpu_dim(d)
