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
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer): real SmolLM2-135M-Instruct weights in bf16 on the CPU, sdpa attention."""
    from gaac_hf.models import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="session")
def wikitext_test() -> str:
    """Held-out WikiText-2 raw test text from ../shared/data."""
    p = SHARED / "data" / "wikitext-2-raw-v1" / "wiki.test.raw"
    if not p.is_file():
        pytest.fail(f"shared data missing: {p}")
    return p.read_text(encoding="utf-8")
