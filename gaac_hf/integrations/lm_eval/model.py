"""lm-evaluation-harness model ``hf-gaac``: HFLM with a GAAC-compressed KV cache.

Importing this module registers the model name ``hf-gaac`` with lm-eval (``import gaac_hf`` alone does
not import lm-eval). lm-eval 0.4.13 cannot discover outside model classes from its own CLI, so use the
``gaac-lm-eval`` console script (:mod:`gaac_hf.integrations.lm_eval.cli`, which also adds the shipped
tasks) or pass an instance to ``lm_eval.simple_evaluate(model=...)``; lm-eval releases after 0.4.13
find ``hf-gaac`` through the ``lm_eval.models`` entry point this package declares::

    gaac-lm-eval --model hf-gaac --model_args pretrained=smollm2,gaac=true,calibration=smollm2-135m \\
        --tasks gaac_piqa --limit 5

Model arguments on top of HFLM's (all removed before ``from_pretrained`` sees the rest):

``gaac`` (bool, default true)
    true: register the GAAC attention function, load with ``attn_implementation="gaac"`` and give every
    model call and every ``generate`` a fresh :class:`gaac_hf.cache.GAACCache`. false: the same code
    path with a stock ``DynamicCache`` and ``sdpa`` attention (the BF16 baseline for parity runs).
``calibration`` (name or path)
    a shipped table name (``smollm2-135m``) or the path of a calibration table (safetensors) for the
    model; required with ``gaac=true``.
``block_size`` (int)
    tokens per encoded block, forwarded to ``GAACCache`` when given (default: the table's geometry).
``prefill_chunk`` (int, default 4 blocks)
    loglikelihood requests are prefilled ``prefill_chunk`` tokens at a time into the cache, so every
    chunk after the first attends over history that was already encoded into compressed blocks
    (a single full-sequence forward would see its own keys only through the prefill path).
``fused`` (bool, default: GAACCache's default)
    false forces GAAC's reference attention (decode + the same SDPA as the stock model) also on CUDA,
    where the fused Triton decode kernel is otherwise used for q_len == 1; parity runs pass false.
``chunked`` (bool, default true)
    false: one forward per batch (plain HFLM with ``gaac=false``), the unchunked reference.
``kv_dtype`` (``bf16``, ``fp8_e4m3``, ``fp8_e5m2``; default ``bf16``)
    an FP8 KV cache: ``calibration`` is then an FP8 table (``gaac-calibrate --kv-dtype``) and is needed by
    both runs: ``gaac=true`` gives ``GAACCache(..., kv_dtype=...)``, ``gaac=false`` the FP8 cache without
    GAAC (:class:`gaac_hf.cache.FP8DynamicCache`, same scales), the baseline of FP8 parity runs.

``pretrained=smollm2`` is shorthand for the offline SmolLM2-135M folder (:func:`gaac_hf.models.smollm2_dir`).
The model dtype defaults to bfloat16 (GAAC compresses BF16 caches only). ``device`` defaults to CUDA
when available and to the CPU otherwise.
"""
from __future__ import annotations

import importlib.metadata
import logging

import torch
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.huggingface import HFLM

from ...cache import FP8DynamicCache, GAACCache, register
from ...calibration import CalibrationTable, FP8Table, find_table
from ...models import cache_keyword, smollm2_dir

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 64
BLOCKS_PER_CHUNK = 4
_STAT_KEYS = ("encoded_blocks", "stored_blocks", "raw_fallback_blocks", "resident_bytes", "bf16_bytes", "fp8_bytes",
              "ratio", "seq_length", "tail_tokens", "format_version")
_SMOLLM2_ALIASES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")


def _as_bool(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return bool(v)
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", "none", ""):
        return False
    raise ValueError(f"expected a boolean, got {v!r}")


def resolve_pretrained(pretrained):
    """``smollm2`` (and aliases) -> the local SmolLM2-135M folder; anything else unchanged."""
    if isinstance(pretrained, str) and pretrained.strip().lower() in _SMOLLM2_ALIASES:
        return str(smollm2_dir())
    return pretrained


MODEL_NAME = "hf-gaac"


def _register_once(cls):
    """``@register_model("hf-gaac")``, unless the name already holds lm-eval's lazy entry-point
    placeholder for this very class.

    lm-eval releases that read the ``lm_eval.models`` entry points register ``hf-gaac`` as an
    ``importlib.metadata.EntryPoint`` and import this module on first use. Registering the class again
    from here would then fail inside lm-eval's registry (it compares the EntryPoint with the class and
    raises); the registry itself stores the class it loaded, so nothing is lost by leaving it alone.
    """
    current = dict(model_registry.items()).get(MODEL_NAME)
    if isinstance(current, importlib.metadata.EntryPoint) and \
            current.value.replace(" ", "") == f"{cls.__module__}:{cls.__qualname__}":
        return cls
    return register_model(MODEL_NAME)(cls)


@_register_once
class GAACLM(HFLM):
    """HFLM whose model calls and generations run through a GAAC (or, for the baseline, a Dynamic) cache."""

    def __init__(
        self,
        pretrained="smollm2",
        gaac: bool | str = True,
        calibration: str | None = None,
        block_size: int | None = None,
        prefill_chunk: int | None = None,
        chunked: bool | str = True,
        fused: bool | str | None = None,
        kv_dtype: str = "bf16",
        dtype="bfloat16",
        device: str | None = None,
        **kwargs,
    ) -> None:
        self.gaac = _as_bool(gaac)
        self.chunked = _as_bool(chunked)
        self.gaac_block_size = int(block_size) if block_size is not None else None
        self.gaac_fused = _as_bool(fused) if fused is not None else None
        self._calibration = None
        self.calibration_path = None
        self.kv_dtype = str(kv_dtype)
        if self.kv_dtype not in ("bf16", "fp8_e4m3", "fp8_e5m2"):
            raise ValueError(f"hf-gaac: kv_dtype must be bf16, fp8_e4m3 or fp8_e5m2, got {kv_dtype!r}")
        self.gaac_calls = 0  # model calls + generations that ran with a GAACCache
        self.gaac_stats: list = []  # cache.stats() summary after every call, when the cache offers it

        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"

        if self.kv_dtype != "bf16":  # FP8: both runs convert with the table's scales
            if calibration is None:
                raise ValueError(f"hf-gaac with kv_dtype={self.kv_dtype} needs calibration=<an FP8 table> (its scales serve "
                                 f"gaac=false too); make one with gaac-calibrate --kv-dtype {self.kv_dtype}")
            path = find_table(str(calibration))
            self._calibration = FP8Table.load(path, kv_dtype=self.kv_dtype)
            self.calibration_path = str(path)
        if self.gaac:
            if calibration is None:
                raise ValueError("hf-gaac with gaac=true needs calibration=<a shipped table name or the path of the "
                                 "model's calibration table>")
            if self._calibration is None:
                path = find_table(str(calibration))  # a shipped name ("smollm2-135m") or a path
                self._calibration = CalibrationTable.load(path)
                self.calibration_path = str(path)
            name = register()  # must happen before from_pretrained validates the name
            attn = name if isinstance(name, str) else "gaac"
        else:
            attn = "sdpa"
        kwargs.setdefault("attn_implementation", attn)
        if self.gaac and kwargs["attn_implementation"] != attn:
            log.warning("hf-gaac: attn_implementation=%s overrides %s; GAAC falls back to its slow path",
                        kwargs["attn_implementation"], attn)

        bs = self.gaac_block_size or (self._calibration.geometry.block_size if self._calibration is not None else DEFAULT_BLOCK_SIZE)
        self.prefill_chunk = int(prefill_chunk) if prefill_chunk is not None else BLOCKS_PER_CHUNK * bs
        if self.prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")

        super().__init__(pretrained=resolve_pretrained(pretrained), dtype=dtype, device=device, **kwargs)

        if self._calibration is not None:
            self._calibration.check_model(self.model.config)  # clear error for a table of another model
            if self.kv_dtype == "bf16" and self.model.dtype != torch.bfloat16:
                raise ValueError(f"GAAC compresses bfloat16 caches; the model is {self.model.dtype} (use dtype=bfloat16)")
        self._fwd_cache_kw = cache_keyword(self.model.forward)
        # generate() takes the cache as **kwargs (``cache`` renamed from ``past_key_values`` in 5.24, the
        # old name deprecated): follow what the model's forward declares.
        self._gen_cache_kw = self._fwd_cache_kw

    # -- caches -------------------------------------------------------------------------------------
    def new_cache(self):
        """A fresh cache for one model call or one generate: GAACCache with gaac=true, else DynamicCache
        (FP8DynamicCache with an FP8 ``kv_dtype``)."""
        if self.kv_dtype != "bf16":
            if self.gaac:
                kw = {"block_size": self.gaac_block_size} if self.gaac_block_size is not None else {}
                return GAACCache(self.model.config, calibration=self._calibration, kv_dtype=self.kv_dtype, **kw)
            return FP8DynamicCache(self.model.config, self._calibration)
        if self.gaac:
            kw = {}
            if self.gaac_block_size is not None:
                kw["block_size"] = self.gaac_block_size
            if self.gaac_fused is not None:
                kw["fused"] = self.gaac_fused
            return GAACCache(self.model.config, calibration=self._calibration, **kw)
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def _record(self, cache) -> None:
        if not self.gaac:
            return
        self.gaac_calls += 1
        stats = getattr(cache, "stats", None)
        if callable(stats):
            try:
                st = stats()
                self.gaac_stats.append({k: st[k] for k in _STAT_KEYS if k in st})
            except Exception as e:  # stats are informative only; never fail an eval over them
                log.debug("GAACCache.stats() failed: %s", e)

    # -- lm-eval hooks --------------------------------------------------------------------------------
    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        if attn_mask is not None or labels is not None:  # seq2seq: not ours
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        if not self.chunked and not self.gaac and self.kv_dtype == "bf16":
            return super()._model_call(inps)  # plain HFLM: one forward, no cache (an FP8 run always has its cache)
        step = inps.shape[1] if not self.chunked else self.prefill_chunk
        cache = self.new_cache()
        logits = []
        with torch.no_grad(), torch.autocast(
            device_type=self.device.type, dtype=self.mixed_precision_dtype, enabled=self.mixed_precision_dtype is not None
        ):
            # lm-eval right-pads causal batches, so chunk boundaries are the same for every row and
            # positions follow from the cache length; padding only ever sits after real tokens.
            for start in range(0, inps.shape[1], step):
                out = self.model(input_ids=inps[:, start : start + step], use_cache=True, **{self._fwd_cache_kw: cache})
                logits.append(out.logits)
        self._record(cache)
        return logits[0] if len(logits) == 1 else torch.cat(logits, dim=1)

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        cache = self.new_cache()
        generation_kwargs[self._gen_cache_kw] = cache
        generation_kwargs["cache_implementation"] = None  # a user cache + a checkpoint cache_implementation raises
        out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        self._record(cache)
        return out

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info.update(gaac=self.gaac, gaac_calibration=self.calibration_path, gaac_block_size=self.gaac_block_size,
                    gaac_prefill_chunk=self.prefill_chunk, gaac_chunked=self.chunked, gaac_kv_dtype=self.kv_dtype)
        return info
