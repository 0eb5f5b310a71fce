"""Shared fixtures. Tests never touch the network: the real model comes from a PyPI wheel."""
import importlib
import os
import sys
from pathlib import Path


def _import_pypi_kernels() -> None:
    """Import the PyPI package ``kernels`` (transformers >= 5.25 requires it and imports it for its hub-kernel
    integration) before anything else can: pytest puts the repository root on ``sys.path``, where our
    top-level ``kernels/`` folder (installed as ``gaac_hf.kernels``) would shadow it, and transformers then
    fails with "cannot import name 'CUDAProperties' from 'kernels'". Without the PyPI package (older
    transformers) nothing is imported and transformers does not look for it."""
    root = Path(__file__).resolve().parents[1]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != root]
    mod = sys.modules.get("kernels")
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve().parent == root / "kernels":
        del sys.modules["kernels"]  # the folder was imported as the package: let the real one replace it
    try:
        importlib.import_module("kernels")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved


_import_pypi_kernels()

import torch

# Triton kernels run on the CPU through the interpreter; it must be set before any @triton.jit runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402

from bf16_linear import ACTIVE as _BF16_LINEAR, install as _fast_bf16_linear, wanted as _want_fast_bf16_linear  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# BF16 linear layers through FP32 GEMM where the CPU has no BF16 dot products (tests/bf16_linear.py says why
# that is the same arithmetic up to the order of FP32 additions): a GEMM 5.6x faster there (session 14)
if _want_fast_bf16_linear():
    _fast_bf16_linear()


@pytest.fixture
def stock_bf16_linear():
    """torch's own BF16 linear kernel for one test (tests that meter tensor bytes)."""
    was = _BF16_LINEAR["on"]
    _BF16_LINEAR["on"] = False
    yield
    _BF16_LINEAR["on"] = was

# Seconds each test file takes on one CPU core (a `--durations=0` run of the default set, rounded; test_cache_memory
# from session 14: its tensor-bytes test keeps the stock BF16 kernel, ~70 s on an AVX2-only CPU; files
# not listed take about a second or less). Collection puts the longest files first, so that with
# `-n 2 --dist loadfile --no-loadscope-reorder` (.ci/run) xdist hands them out first and its two workers
# finish together (its own reorder, by the number of tests in a file, started the long files last). A
# stale entry only changes the order, never what runs.
FILE_SECONDS = {
    "test_lm_eval.py": 109, "test_kernels_codec.py": 88, "test_cache.py": 87, "test_kernels_attention.py": 79,
    "test_codec.py": 77, "test_cpu_kernels.py": 57, "test_cuda_build.py": 45, "test_cache_fp8.py": 38,
    "test_cache_v3.py": 37, "test_serving.py": 37, "test_v3_core.py": 36, "test_v3_kernels_host.py": 25,
    "test_v3_cuda_build.py": 29, "test_tensor_parallel.py": 21, "test_cache_memory.py": 80, "test_fp8_core.py": 8,
    "test_fp8_kernels_host.py": 6,
    "test_host_overhead.py": 10, "test_calibration.py": 8, "test_fp8_codec.py": 4, "test_layout.py": 2,
}


def pytest_collection_modifyitems(config, items):
    """Longest files first (FILE_SECONDS); a stable sort, so each file's tests keep their order."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer): real SmolLM2-135M-Instruct weights in bf16 on the CPU, sdpa attention."""
    from gaac_hf.models import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="session")
def model_tok(smollm2):
    """SmolLM2 with the GAAC attention registered (``gaac_hf.register()``) and a pad token."""
    import gaac_hf

    model, tok = smollm2
    gaac_hf.register()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


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


def first_layers_cache(model, ids: torch.Tensor, layers: int):
    """DynamicCache of a forward of ``ids`` through the model's first ``layers`` decoder layers only (K/V of
    layer i depend only on layers < i, so they are the full model's; a CPU without BF16 matrix instructions
    pays for every layer it runs)."""
    from transformers import DynamicCache

    from gaac_hf.models import cache_kwargs

    full = model.model.layers
    model.model.layers = full[:layers]
    try:
        cache = DynamicCache()
        with torch.no_grad():
            model.model(ids, **cache_kwargs(model.model, cache), use_cache=True)
    finally:
        model.model.layers = full
    return cache


def synthetic_cache(layers: int, heads: int, head_dim: int, block_size: int, **kwargs):
    """A GAACCache for a tiny Llama config and a table whose windows fit random normals (no weights)."""
    from transformers import LlamaConfig

    from gaac_hf import GAACCache
    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.format import BlockGeometry

    cfg = LlamaConfig(num_hidden_layers=layers, num_attention_heads=2 * heads, num_key_value_heads=heads,
                      head_dim=head_dim, hidden_size=2 * heads * head_dim, vocab_size=32)
    shape = (layers, 2, heads, head_dim)
    table = CalibrationTable(torch.full(shape, 123, dtype=torch.uint8), torch.full(shape, 119, dtype=torch.uint8),
                             BlockGeometry(block_size=block_size, head_dim=head_dim))
    return GAACCache(cfg, calibration=table, **kwargs)
