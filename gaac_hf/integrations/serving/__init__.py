"""GAAC pages in transformers' continuous batching (``model.generate_batch``, the serving engine).

    from gaac_hf.integrations.serving import gaac_serving

    with gaac_serving(model, calibration="smollm2-135m", kv_budget_bytes=2 << 30) as serving:
        outputs = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=serving.config)
    serving.stats()   # bytes and blocks of the GAAC pool the engine used

Inside the ``with`` block the engine's paged cache stores full-attention blocks as GAAC slots
(:mod:`gaac_hf.cache.pages`; how it plugs in: :mod:`.engine_524` for transformers 5.23-5.25,
:mod:`.engine_517` for 5.17, both on :mod:`.batch`), so a KV budget holds ~1.3-1.4x the blocks of
BF16 and the engine's own scheduler admits and preempts on that real free space. On exit the one
patched symbol (``continuous_api.PagedAttentionCache``) is restored (on 5.17 also the model's attention
implementation, switched to ``paged|sdpa`` inside the block; with ``fused_decode=True`` also the
``AttentionInterface`` entry the engine calls, see :mod:`.attention`); nothing is patched at import.
:func:`bf16_serving_config` gives the BF16 engine the same budget and settings, for comparisons.

The budget (``kv_budget_bytes``) pays for everything the GAAC pool holds: the compressed slots, the
BF16 frames of open blocks (``open_pages``: a batch's new tokens are written there before they are
compressed) and the entry table. The engine's activations and index buffers are outside it, as for
the BF16 engine.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

import torch
import transformers
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from ...cache.pages import TRASH_FRAMES, slot_bytes_for

#: releases whose continuous-batching engine this integration is written for (major.minor); 5.17 and
#: 5.24 are tested (tests/test_serving.py runs on whichever is installed), 5.23 shares 5.24's engine
SUPPORTED = ("5.17", "5.23", "5.24", "5.25")
#: set to 1 to try an unsupported release anyway (at your own risk: outputs are still checked by nothing)
UNTESTED_ENV = "GAAC_SERVING_UNTESTED"
#: defaults of the GAAC serving config where the user sets nothing (they fix the number of open frames)
DEFAULT_PAGE_SIZE = 64  # one v3 block: the BF16 page of an open block is as small as the format allows
DEFAULT_MAX_BATCH_TOKENS = 1024
DEFAULT_MAX_REQUESTS = 16
#: real SmolLM2 K/V blocks of 64 tokens take 0.703-0.706 of their BF16 bytes over all 30 layers
#: (eval/results/serving_capacity_smollm2.json); blocks above the slot stay BF16 (overflows)
DEFAULT_SLOT_FRACTION = 0.72


@dataclass
class ServingSession:
    """What :func:`gaac_serving` yields: the engine config to pass on, and the GAAC caches the engine
    built inside the ``with`` block (one per manager / batch processor)."""

    config: ContinuousBatchingConfig
    page_size: int
    slot_bytes: int
    open_pages: int
    caches: list = field(default_factory=list)

    def stats(self) -> dict:
        """The last cache's :meth:`~.engine_524.GAACPagedAttentionCache.gaac_stats`."""
        if not self.caches:
            raise RuntimeError("no GAAC cache was built in this session yet (run generate_batch inside the with block)")
        return self.caches[-1].gaac_stats()


def check_version(version: str | None = None) -> None:
    """Raise with the supported releases when this transformers' engine is not one of them."""
    version = version or transformers.__version__
    if ".".join(version.split(".")[:2]) in SUPPORTED or os.environ.get(UNTESTED_ENV) == "1":
        return
    raise RuntimeError(f"GAAC serving supports transformers {', '.join(SUPPORTED)} continuous batching; this is {version}. "
                       f"Install one of those, or set {UNTESTED_ENV}=1 to try anyway.")


def _is_517(version: str | None = None) -> bool:
    return tuple(int(x) for x in (version or transformers.__version__).split(".")[:2]) < (5, 23)


def _shape(config) -> tuple[int, int, int]:
    """(full-attention layers, kv heads, head_dim) of a text config."""
    types = getattr(config, "layer_types", None)
    if types is None:
        types = ["sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"] * config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return sum(t == "full_attention" for t in types), heads, head_dim


def _base_config(overrides: dict) -> dict:
    """The engine settings both pools run with (GAAC needs them; the BF16 baseline gets the same):
    no block sharing, no async batching, no CPU swap pool, our page size and batch limits."""
    kw = dict(page_size=DEFAULT_PAGE_SIZE, max_batch_tokens=DEFAULT_MAX_BATCH_TOKENS,
              max_requests_per_batch=DEFAULT_MAX_REQUESTS)
    kw.update(overrides)
    for key in ("allow_block_sharing", "use_async_batching", "cpu_offload_space"):
        if key in overrides:
            raise ValueError(f"gaac_serving sets {key} itself (see gaac_hf.integrations.serving.engine_524)")
    kw.update(allow_block_sharing=False, use_async_batching=False, cpu_offload_space=0.0)
    return kw


def _engine_config(kw: dict, num_blocks: int, **extra) -> ContinuousBatchingConfig:
    """A ContinuousBatchingConfig for this release (5.17 calls the page ``block_size`` and has no
    ``auto_switch_to_flash``; its block-table decode path is switched off)."""
    kw = dict(kw, **extra)
    if _is_517():
        kw["block_size"] = kw.pop("page_size")
        kw.pop("auto_switch_to_flash", None)
        kw["max_blocks_per_request"] = 0
    return ContinuousBatchingConfig(num_blocks=num_blocks, **kw)


def bf16_serving_config(model, kv_budget_bytes: int, **overrides) -> ContinuousBatchingConfig:
    """The engine's own BF16 paged cache holding ``kv_budget_bytes`` of KV (full-attention layers),
    with the settings and batch limits :func:`gaac_serving` uses: the baseline of a comparison."""
    layers, h, d = _shape(model.config.get_text_config())
    kw = _base_config(overrides)
    block = layers * 2 * kw["page_size"] * h * d * 2
    if kv_budget_bytes < block:
        raise ValueError(f"kv_budget_bytes {kv_budget_bytes} holds no block of {block} bytes")
    return _engine_config(kw, kv_budget_bytes // block)


def _free_memory_budget(model, fraction: float) -> int:
    """``fraction`` of the free memory of the model's CUDA device, in bytes."""
    if not 0 < fraction <= 1:
        raise ValueError(f"free_memory_fraction must be in (0, 1], got {fraction}")
    device = getattr(model, "device", torch.device("cpu"))
    if device.type != "cuda":
        raise ValueError(f"free_memory_fraction needs a model on a CUDA device (this one is on {device}): pass kv_budget_bytes")
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * fraction)


def _sizes(config, calibration, page: int, slot_fraction: float) -> dict:
    """Per-block byte sizes of the GAAC pool for this model."""
    from ...cache.cache import _resolve_table

    layers, h, d = _shape(config)
    if layers == 0:
        raise ValueError("GAAC serving compresses full-attention layers; this model has none")
    table = _resolve_table(calibration)
    table.check_model(config)
    slot = slot_bytes_for(h, d, page, slot_fraction)
    return dict(table=table, slot_bytes=slot, bf16_block=layers * 2 * page * h * d * 2, slot_block=layers * slot,
                entry_block=layers * 2 * h * (page // table.geometry.block_size) * 8)


@contextlib.contextmanager
def gaac_serving(model, calibration, *, kv_budget_bytes: int | None = None, num_blocks: int | None = None,
                 free_memory_fraction: float | None = None,
                 slot_fraction: float = DEFAULT_SLOT_FRACTION, open_pages: int | None = None,
                 fused_decode: bool | None = None, **overrides):
    """Serve ``model`` with GAAC pages inside the ``with`` block; yields a :class:`ServingSession`
    whose ``config`` (a ContinuousBatchingConfig) goes to ``generate_batch`` / the manager.

    Args:
        model: a BF16 causal LM with ``sdpa`` attention (the engine's attention reads what the GAAC pool
            returns, bit for bit the BF16 K/V).
        calibration: the model's calibration table (a shipped name, a path, a CalibrationTable).
        kv_budget_bytes: bytes of the whole GAAC pool (slots + frames + entry table); or
        num_blocks: the number of GAAC blocks instead (e.g. the BF16 engine's, to compare schedules); or
        free_memory_fraction: the budget as this fraction of the model device's free memory now
            (``torch.cuda.mem_get_info``; leave room for activations, as the engine's own
            ``max_memory_percent`` does).
        slot_fraction: slot size as a fraction of a page's BF16 bytes (blocks that do not fit stay BF16).
        open_pages: BF16 frames for open blocks; default: enough for one batch of ``max_batch_tokens``
            new tokens plus one open block per request of a batch.
        fused_decode: run decode steps (every request adds one token) through the fused v3 CUDA kernel,
            which reads the compressed pages directly (:mod:`.attention`; needs the ``cuda`` extra on Hopper
            and ``page_size`` = the v3 block size). None (default): wherever the kernel can run (on the
            H200 1.31-1.38x the BF16 engine's output tokens/s at 8 / 16 GiB, ``eval/results/serving_h200.json``);
            on a GPU where it cannot, says why once and reads decoded pages (on the CPU, where no fused
            kernel exists, silently so). True: as None, but says why on any device. False: decoded pages.
        overrides: other ContinuousBatchingConfig fields (``page_size``, ``max_batch_tokens``, ...).
    """
    from transformers.generation.continuous_batching import continuous_api

    check_version()
    if getattr(model, "dtype", torch.bfloat16) != torch.bfloat16:
        raise ValueError(f"GAAC serving stores bfloat16 K/V losslessly; this model is {model.dtype}: load it with "
                         "dtype=torch.bfloat16")
    if "use_cuda_graph" in overrides:
        raise ValueError("gaac_serving sets use_cuda_graph itself (a block's close runs host code between layers)")
    if sum(x is not None for x in (kv_budget_bytes, num_blocks, free_memory_fraction)) != 1:
        raise ValueError("pass one of kv_budget_bytes (the pool's bytes), num_blocks (its blocks) or free_memory_fraction")
    if free_memory_fraction is not None:
        kv_budget_bytes = _free_memory_budget(model, free_memory_fraction)
    kw = _base_config(overrides)
    page = kw["page_size"]
    sz = _sizes(model.config.get_text_config(), calibration, page, slot_fraction)
    frames = open_pages or TRASH_FRAMES + kw["max_requests_per_batch"] + math.ceil(kw["max_batch_tokens"] / page)
    if num_blocks is None:
        room = kv_budget_bytes - frames * sz["bf16_block"]
        num_blocks = room // (sz["slot_block"] + sz["entry_block"])
        if num_blocks < 1:
            raise ValueError(f"kv_budget_bytes {kv_budget_bytes} does not cover {frames} open BF16 pages "
                             f"({frames * sz['bf16_block']} bytes) and one compressed block ({sz['slot_block']} bytes): "
                             "raise it, or lower open_pages / max_batch_tokens / max_requests_per_batch")
    cb_config = _engine_config(kw, num_blocks, use_cuda_graph=False, auto_switch_to_flash=False)
    session = ServingSession(cb_config, page, sz["slot_bytes"], frames)
    if _is_517():
        from .engine_517 import GAACPagedAttentionCache517 as base
    else:
        from .engine_524 import GAACPagedAttentionCache as base
    group = _fused_group(model, sz["table"], page, quiet_cpu=fused_decode is None) if fused_decode is not False else None
    cls = type("GAACPagedAttentionCacheBound", (base,),
               {"_gaac": dict(table=sz["table"], slot_bytes=sz["slot_bytes"], frames=frames, num_blocks=num_blocks,
                              session=session, fused_group=group)})
    saved = continuous_api.PagedAttentionCache
    attn = model.config._attn_implementation
    continuous_api.PagedAttentionCache = cls
    wrapped = _wrap_attention(group is not None)
    try:
        if _is_517() and attn != "paged|sdpa":
            model.set_attn_implementation("paged|sdpa")  # 5.17 would pick flash, which reads block tables itself
        yield session
    finally:
        continuous_api.PagedAttentionCache = saved
        if wrapped is not None:
            from transformers.modeling_utils import AttentionInterface

            name, original = wrapped
            AttentionInterface._global_mapping[name] = original
        if model.config._attn_implementation != attn:
            model.set_attn_implementation(attn)


def _fused_group(model, table, page: int, quiet_cpu: bool = False) -> int | None:
    """Query heads per kv head when decode steps can run the fused v3 kernel on the model's device, else
    None (with a warning that says why; none for a CPU model when ``quiet_cpu``: the default path there)."""
    import warnings

    from ...cache.fused_v3 import why_unavailable
    from ...cache.pool_v3 import geometry_v3

    cfg = model.config.get_text_config()
    group = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    block = geometry_v3(table.geometry).block_size
    device = torch.device(getattr(model, "device", "cpu"))
    reason = why_unavailable(device, table.geometry.head_dim, group)
    if reason is None and page != block:
        reason = f"page_size {page} is not the v3 block size {block}"
    if reason is not None and quiet_cpu and device.type == "cpu":
        return None
    if reason is not None:
        warnings.warn(f"gaac_serving (fused decode): decode steps read decoded pages ({reason})", RuntimeWarning,
                      stacklevel=3)
        return None
    return group


def _wrap_attention(on: bool):
    """Put the fused-decode wrapper (:mod:`.attention`) in the AttentionInterface entry this release's
    engine calls; returns (name, original) to restore, or None."""
    if not on:
        return None
    from transformers.modeling_utils import AttentionInterface

    from .attention import paged_sdpa_517, sdpa_524

    name, wrap = ("paged|sdpa", paged_sdpa_517) if _is_517() else ("sdpa", sdpa_524)
    original = AttentionInterface._global_mapping[name]
    AttentionInterface._global_mapping[name] = wrap(original)
    return name, original
