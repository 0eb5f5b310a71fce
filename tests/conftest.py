"""Shared fixtures. Tests never touch the network: the real model comes from a PyPI wheel."""
import os
from pathlib import Path

import torch

# Triton kernels run on the CPU through the interpreter; it must be set before any @triton.jit runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer): real SmolLM2-135M-Instruct weights in bf16 on the CPU, sdpa attention."""
    from gaac_hf.models import load_smollm2

    return load_smollm2()


def real_text(split: str, raw: bool) -> str:
    """WikiText-2 from the places gaac_hf.data searches in order, or skip with the one reason it gives."""
    from gaac_hf.data import DataNotFound, wikitext

    try:
        return wikitext(split, raw)[0]
    except DataNotFound as e:
        pytest.skip(f"real text not available: {e}")


@pytest.fixture(scope="session")
def wikitext_test() -> str:
    """Held-out WikiText-2 raw test text."""
    return real_text("test", raw=True)


@pytest.fixture(scope="session")
def wikitext_valid() -> str:
    """WikiText-2 validation text (what the shipped table was calibrated on)."""
    return real_text("validation", raw=False)
