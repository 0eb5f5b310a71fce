"""GAACCache: the transformers ``Cache`` whose full-attention layers are :class:`GAACLayer`."""
from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache

from ..calibration.shipped import find_table
from ..calibration.table import CalibrationTable
from ..format import MODE_3BIT, MODE_4BIT, MODE_RAW
from .compat import layer_types_and_kwargs
from .fp8 import GAACFP8Layer, fp8_cache_stats
from .host import _HOST_SLOTS_PER_LAYER, _CountsMemo, _DeferredStore, _DeviceTables, _FitnessCheck, _HostSlab
from .layer import _K, _V, GAACLayer
from .pool_v3 import geometry_v3
from .pool_v4 import geometry_v4


def _resolve_table(calibration) -> CalibrationTable:
    if isinstance(calibration, CalibrationTable):
        return calibration
    dtype = getattr(calibration, "dtype", None)
    if isinstance(dtype, str) and dtype.startswith("fp8"):  # an FP8Table given to a BF16 cache
        raise ValueError(f"this is an FP8 calibration table ({dtype}): pass kv_dtype={dtype!r} to GAACCache for an FP8 "
                         "cache, or a BF16 table for kv_dtype='bf16'")
    if calibration is None:
        raise ValueError(
            "GAACCache needs calibration=<a shipped table name such as 'smollm2-135m', a path to a .safetensors "
            "table, or a CalibrationTable> (make one with gaac-calibrate or gaac_hf.calibration)"
        )
    return CalibrationTable.load(find_table(calibration))


#: the K/V dtypes a GAACCache stores: BF16 as it is, or FP8 (converted as an FP8 cache converts it, then GAAC)
KV_DTYPES = ("bf16", "fp8_e4m3", "fp8_e5m2")


def _resolve_fp8_table(calibration, kv_dtype: str):
    """The :class:`~gaac_hf.calibration.fp8.FP8Table` for ``kv_dtype`` from a table object or a path."""
    from ..calibration.fp8 import FP8Table

    if isinstance(calibration, FP8Table):
        calibration.check_dtype(kv_dtype)
        return calibration
    if isinstance(calibration, CalibrationTable):
        raise ValueError(f"kv_dtype={kv_dtype!r} needs an FP8 calibration table (static scales + windows of FP8 codes), "
                         "got a BF16 CalibrationTable: make one with gaac-calibrate --kv-dtype " + kv_dtype)
    if calibration is None:
        raise ValueError(f"GAACCache(kv_dtype={kv_dtype!r}) needs calibration=<an FP8Table or the path of one> "
                         f"(make one with gaac-calibrate --kv-dtype {kv_dtype} or gaac_hf.calibration.calibrate_fp8)")
    return FP8Table.load(find_table(calibration), kv_dtype=kv_dtype)


def _config_of(config_or_model):
    """(config, dtype it says the K/V will be): a transformers config as it is, a model's ``.config``
    (with the model's own parameter dtype), anything else a TypeError that says what to pass."""
    from transformers import PretrainedConfig

    if isinstance(config_or_model, PretrainedConfig):
        return config_or_model, getattr(config_or_model, "dtype", None)
    inner = getattr(config_or_model, "config", None)
    if isinstance(inner, PretrainedConfig):  # a model: its config, and the dtype its weights really have
        return inner, getattr(config_or_model, "dtype", None)
    raise TypeError(f"GAACCache(config, ...) takes the model's config: pass model.config "
                    f"(got {type(config_or_model).__name__})")


def _check_dtype(dtype) -> None:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if dtype in (torch.float16, torch.float32, torch.float64):
        raise ValueError(
            f"GAACCache stores bfloat16 K/V losslessly, but this model is {dtype}: load it with "
            "dtype=torch.bfloat16 (or use DynamicCache). If its weights are already bfloat16 (converted with "
            ".to() after loading), set model.config.dtype = torch.bfloat16 or pass the model itself.")


class GAACCache(Cache):
    """Lossless GAAC KV cache for transformers models.

    Example::

        import gaac_hf
        gaac_hf.register()                       # once, before loading: attn_implementation="gaac"
        model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation="gaac")
        cache = gaac_hf.GAACCache(model.config, calibration="calibration_data/smollm2-135m.safetensors")
        out = model.generate(**inputs, cache=cache, cache_implementation=None)  # past_key_values= before 5.24
        print(cache.stats())

    Args:
        config: the model's config (pass ``model.config`` itself: its ``_attn_implementation`` is read
            live to decide whether update() returns full K/V or a tail carrier), or the model (its
            ``.config`` is taken). A float16/float32 dtype in the config (or of the model's weights)
            is refused here, with the fix.
        calibration: a :class:`~gaac_hf.calibration.CalibrationTable` or a path to one. It must fit
            the model (``table.check_model``), else ValueError.
        block_size: override the table's block size (the windows do not depend on it).
        return_full_kv: None (default) = automatic from the config; True = always return full K/V
            (any attention function works); False = always return the tail carrier.
        fused: decode steps through a kernel over the compressed blocks. None (default): True on CUDA,
            False on the CPU. True: on CUDA the fused kernel of the layer's format (v3/v4 on Hopper: the
            CUDA C++ kernels of ``gaac_hf.cache.fused_v3``; format v2: the Triton kernel); on the CPU,
            format v3, the tiled C++ attention (faster at long contexts, within BF16 rounding of SDPA,
            not bit-identical to it: ``gaac_hf.cache.tiled``). ``"auto"`` (format v2, CUDA):
            the fused kernel below ``gaac_hf.cache.attention.FUSED_MAX_TOKENS`` cached tokens,
            decode-then-SDPA (SDPA without its cuDNN backend) from there on: less GPU time at long
            contexts and less wall time when batched, a little more wall time at B=1 (measured on the
            H200 before the row offsets: ``lab/results/superseded/e2e_h200_64k_auto.json``,
            ``host_ab_h200_64k_b4.json``, ``host_ab_h200_16k_v2.json``; ``docs/CACHE.md`` "Auto"). It
            allocates one layer's decoded K and V per step (bf16 ``2 x [B, H, S, D]``).
            False: never (decode + SDPA, bit-identical to sdpa; use it with attention masks that are
            not of the left-padding form). The CPU default.
        triton_codec: on CUDA, encode and decode blocks with the Triton kernels of
            ``gaac_hf.kernels.triton`` (byte- and bit-identical to the reference codec; default). False
            keeps the reference PyTorch codec everywhere.
        checksums: write a checksum per block at encode time (8 bytes per block, counted in
            ``allocated_bytes``) that :meth:`verify` compares; structural checks run without them.
        format_version: how blocks are stored: 2 (``docs/FORMAT.md``), 3 (``docs/FORMAT_V3.md``: one
            byte pool of variable-length blocks, int64 block-table entries; on the CPU decode steps
            and short chunks attend tile by tile over the compressed blocks, ``docs/CACHE.md``), or
            4 (``docs/FORMAT_V4.md``: register tiles with fixed 4-bit lanes, the v3 pool's paging;
            ~1.30x instead of v3's ~1.42x on real K/V, and decode steps on Hopper run the register-tile
            kernel, ``gaac_hf.kernels.cuda.fused_attention_v4``; head_dim 64/128/192/256, the kernel
            64/128/256), or None: chosen per layer at the first update (``gaac_hf.cache.pool_v3.default_format``:
            v4 where the fused v4 kernel serves the layer, i.e. Hopper with the ``cuda`` extra: decode steps
            faster than cuDNN at ~1.30x; then v3 where the fused v3 kernel serves it; v3 on the CPU with the
            CPU library (decode + SDPA through its C++ decoder); v2 elsewhere).
        kv_dtype: ``"bf16"`` (default: the K/V as the model makes them, lossless) or ``"fp8_e4m3"`` /
            ``"fp8_e5m2"``: an FP8 KV cache, ``calibration`` then an FP8 table
            (:class:`~gaac_hf.calibration.fp8.FP8Table`, ``gaac-calibrate --kv-dtype``). K/V are converted
            to FP8 with the table's static per-tensor scales exactly as
            :class:`~gaac_hf.cache.fp8_baseline.FP8DynamicCache` converts them (the only approximation),
            stored losslessly as format v3 FP8 tiles, and attention reads the dequantized values
            (:mod:`gaac_hf.cache.fp8`): outputs are bit-identical to that baseline. CPU only for now;
            ``fused``, ``triton_codec``, ``checksums`` and ``return_full_kv=False`` do not apply.

    Full-attention layers get a :class:`GAACLayer`; sliding-window, chunked, linear and dummy layers
    keep their stock transformers layer (uncompressed).
    """

    def __init__(self, config, calibration=None, *, block_size: int | None = None,
                 return_full_kv: bool | None = None,
                 fused: bool | str | None = None, triton_codec: bool = True, checksums: bool = False,
                 format_version: int | None = None, kv_dtype: str = "bf16") -> None:
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        if kv_dtype != "bf16":
            self._init_fp8(config, calibration, block_size, return_full_kv, checksums, format_version)
            return
        if fused not in (None, True, False, "auto"):
            raise ValueError(f'fused must be None, True, False or "auto", got {fused!r}')
        if format_version not in (None, 2, 3, 4):
            raise ValueError(f"format_version must be 2, 3, 4 or None (the default per device), got {format_version!r}")
        config, dtype = _config_of(config)
        _check_dtype(dtype)
        table = _resolve_table(calibration)
        table.check_model(config)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        g = table.geometry
        geometry = dataclasses.replace(g, block_size=block_size or g.block_size)
        if format_version == 3:
            geometry_v3(geometry)  # refuses token-axis tables now rather than at the first update
        elif format_version == 4:
            geometry_v4(geometry)  # and head_dims format v4 cannot lay out
        self.geometry = geometry
        self.table = table
        types, kwargs = layer_types_and_kwargs(text)
        memo = _CountsMemo()  # shared: in a step every GAAC layer asks for the same counts
        deferred = _DeferredStore()  # shared: a prefill's store waits until the next layer's append
        slab = _HostSlab(_HOST_SLOTS_PER_LAYER * len(types))  # shared: one pinned allocation per cache
        on_device = _DeviceTables()  # shared: the table crosses to the GPU once, not 4 copies per layer
        fitness = _FitnessCheck(table)  # shared: one warning per cache when the table does not fit
        layers = [
            GAACLayer(i, table, geometry, text, return_full_kv, fused, triton_codec, memo, deferred, slab, on_device,
                      fitness, checksums, format_version)
            if lt == "full_attention"
            else DYNAMIC_LAYER_TYPE_MAPPING[lt](**kw)
            for i, (lt, kw) in enumerate(zip(types, kwargs))
        ]
        if not any(isinstance(layer, GAACLayer) for layer in layers):
            raise ValueError("this model has no full-attention layers: GAACCache would compress nothing")
        super().__init__(layers=layers)

    def _init_fp8(self, config, calibration, block_size, return_full_kv, checksums, format_version) -> None:
        """Build an FP8 cache (``kv_dtype`` fp8_*): :class:`~gaac_hf.cache.fp8.GAACFP8Layer` per full-attention layer."""
        if format_version not in (None, 3):
            raise ValueError(f"FP8 caches store format v3 FP8 tiles; format_version={format_version!r} does not apply")
        if checksums:
            raise ValueError("checksums=True is not implemented for FP8 caches yet (the FP8 tiles carry none)")
        if return_full_kv is False:
            raise ValueError("an FP8 cache always returns the dequantized K/V (there is no attention over FP8 tiles yet): "
                             "return_full_kv=False does not apply")
        config, _ = _config_of(config)
        table = _resolve_fp8_table(calibration, self.kv_dtype)
        table.check_model(config)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        self.table = table
        self.geometry = dataclasses.replace(table.geometry, block_size=block_size or table.geometry.block_size)
        types, kwargs = layer_types_and_kwargs(text)
        layers = [GAACFP8Layer(i, table, self.geometry) if lt == "full_attention" else DYNAMIC_LAYER_TYPE_MAPPING[lt](**kw)
                  for i, (lt, kw) in enumerate(zip(types, kwargs))]
        if not any(isinstance(layer, GAACFP8Layer) for layer in layers):
            raise ValueError("this model has no full-attention layers: GAACCache would compress nothing")
        super().__init__(layers=layers)

    @classmethod
    def from_dynamic_cache(cls, cache: Cache, config, calibration=None, **kwargs) -> "GAACCache":
        """Compress a filled transformers cache (e.g. after a prefill with another attention), or, with an
        FP8 ``kv_dtype``, an :class:`~gaac_hf.cache.FP8DynamicCache` built from the same table (its codes kept).

        Full-attention layers are encoded into GAAC layers; the other (sliding-window, linear...)
        layer objects of ``cache`` are taken over as they are. ``kwargs`` go to the constructor.
        """
        new = cls(config, calibration, **kwargs)
        if len(cache.layers) != len(new.layers):
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {len(new.layers)}")
        for i, (src, dst) in enumerate(zip(cache.layers, new.layers)):
            if not isinstance(dst, (GAACLayer, GAACFP8Layer)):
                new.layers[i] = src
            elif getattr(src, "keys", None) is None or not src.keys.numel():
                continue
            elif isinstance(dst, GAACLayer):
                dst.append(src.keys, src.values)
            else:  # FP8: an FP8DynamicCache's codes are kept as they are, anything else is converted
                dst.take_over(src)
        return new

    def verify(self) -> dict:
        """Check every stored block: reserved tags and escape-stream lengths / offsets always, the
        per-block checksums when built with ``checksums=True``. Raises ValueError naming the layer,
        K or V and the rows; returns the counts checked. Host syncs (call it between steps)."""
        out = {"slot_rows": 0, "raw_rows": 0}
        if self.kv_dtype != "bf16":  # FP8 tiles: decoding every block checks its structure
            for layer in self.layers:
                if isinstance(layer, GAACFP8Layer) and layer.is_initialized:
                    for kind, name in ((_K, "K"), (_V, "V")):
                        try:
                            layer.codes(kind)
                        except ValueError as e:
                            raise ValueError(f"layer {layer.layer_idx} {name}: {e}") from None
                    raw = sum(p.raw_blocks for p in layer.pools)
                    out = {"slot_rows": out["slot_rows"] + sum(p.blocks for p in layer.pools) - raw,
                           "raw_rows": out["raw_rows"] + raw}
            return out | {"checksums": False}
        for layer in self.layers:
            if isinstance(layer, GAACLayer):
                got = layer.verify()
                out = {k: out[k] + got[k] for k in ("slot_rows", "raw_rows")} | {"checksums": got["checksums"]}
        return out

    def stats(self, per_layer: bool = False) -> dict:
        """Resident KV bytes against a BF16 cache, compression ratio and mode shares. (An FP8 cache,
        ``kv_dtype`` fp8_*, reports against the FP8 baseline instead: :func:`gaac_hf.cache.fp8.fp8_cache_stats`,
        ``docs/CACHE.md`` "FP8 caches".)

        Byte counts are host-side integers; the mode and raw-row counters live on the device and
        are synced once, here. Keys:

        - ``resident_bytes``: bytes of the GAAC layers' data (slot rows with their escape-stream
          offsets, escape streams, raw rows, block tables, tails); ``bf16_bytes``: what a BF16 DynamicCache would hold for the same layers
          and tokens; ``ratio`` = bf16/resident, ``savings`` = 1 - resident/bf16.
        - ``allocated_bytes``: every byte the GAAC layers' tensors hold, capacity included (pools,
          tables and tails grow in fixed pages; the bound is in ``docs/CACHE.md`` "Memory").
        - ``allocated_vs_bf16`` = allocated/bf16 and ``resident_vs_bf16`` = resident/bf16: the
          fraction of a BF16 cache's bytes that this cache allocates / holds (0.73 = 27% saved).
        - ``stock_layer_bytes``: uncompressed layers kept stock (sliding window etc.).
        - ``mode_shares`` (and ``_k``/``_v``): fraction of encoded groups in 3-bit / 4-bit / raw mode.
        - ``raw_fallback_blocks`` (raw rows held), ``stored_blocks`` (distinct blocks held),
          ``slot_rows`` (slot rows held: every encoded block takes one, a raw fallback's stays
          unused until a compaction drops it), ``escape_bytes`` (escape heap bytes in use),
          ``encoded_blocks`` (encoded since creation);
          ``tail_tokens``, ``seq_length`` (of the first GAAC layer).
        """
        if self.kv_dtype != "bf16":
            return fp8_cache_stats(self.layers)  # against the FP8 baseline (ratio_vs_fp8) and BF16 (ratio)
        gaac = [(i, layer) for i, layer in enumerate(self.layers) if isinstance(layer, GAACLayer)]
        per = [(i, layer._stats()) for i, layer in gaac]
        dev = next((c.device for _, s in per for c in s["counts"] if c.device.type != "cpu"), torch.device("cpu"))
        counts = torch.stack([torch.stack([c.to(dev) for c in s["counts"]]) for _, s in per]).cpu()  # [L, 2, 6]: one sync
        modes, raw_rows, orphans = counts[..., :3], counts[..., 3].sum(1), counts[..., 4].sum(1)  # [L, 2, 3], [L], [L]
        heap_bytes = counts[..., 5].sum(1)  # [L]
        g = self.geometry
        for j, (_, s) in enumerate(per):
            s["raw_blocks"] = int(raw_rows[j])
            s["blocks"] = s["slot_rows"] - int(orphans[j]) + s["raw_blocks"]
            s["escape_bytes"] = int(heap_bytes[j])
            # a slot row costs its planes and its 8-byte esc_start (+ 8 checksum bytes if kept)
            cs = 8 * s["checksums"]
            s["resident"] = s["resident_v3"] if "resident_v3" in s else (
                s["fixed"] + s["slot_rows"] * (g.slot_bytes + 8 + cs) + s["escape_bytes"] + s["raw_blocks"] * (g.raw_bytes + cs))

        def shares(c: torch.Tensor) -> dict:
            tot = max(int(c.sum()), 1)
            return {"3bit": int(c[MODE_3BIT]) / tot, "4bit": int(c[MODE_4BIT]) / tot, "raw": int(c[MODE_RAW]) / tot}

        resident = sum(s["resident"] for _, s in per)
        bf16 = sum(s["bf16"] for _, s in per)
        allocated = sum(s["allocated"] for _, s in per)
        stock = 0
        for layer in self.layers:
            if not isinstance(layer, GAACLayer):
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if isinstance(t, torch.Tensor):
                        stock += t.numel() * t.element_size()
        out = {
            "resident_bytes": resident,
            "bf16_bytes": bf16,
            "ratio": bf16 / resident if resident else 0.0,
            "savings": 1 - resident / bf16 if bf16 else 0.0,
            "allocated_bytes": allocated,
            "allocated_vs_bf16": allocated / bf16 if bf16 else 0.0,
            "resident_vs_bf16": resident / bf16 if bf16 else 0.0,
            "stock_layer_bytes": stock,
            "mode_shares": shares(modes.sum((0, 1))),
            "mode_shares_k": shares(modes[:, _K].sum(0)),
            "mode_shares_v": shares(modes[:, _V].sum(0)),
            "raw_fallback_blocks": sum(s["raw_blocks"] for _, s in per),
            "stored_blocks": sum(s["blocks"] for _, s in per),
            "slot_rows": sum(s["slot_rows"] for _, s in per),
            "escape_bytes": sum(s["escape_bytes"] for _, s in per),
            "encoded_blocks": sum(s["encoded"] for _, s in per),
            "tail_tokens": per[0][1]["tail_tokens"],
            "seq_length": per[0][1]["tokens"],
            "block_size": self.geometry.block_size,
            "slot_bytes": self.geometry.slot_bytes,
            "format_version": gaac[0][1].format_version,
        }
        if per_layer:
            out["layers"] = [
                {"layer": i, "resident_bytes": s["resident"], "bf16_bytes": s["bf16"],
                 "ratio": s["bf16"] / s["resident"] if s["resident"] else 0.0,
                 "mode_shares_k": shares(modes[j, _K]), "mode_shares_v": shares(modes[j, _V]),
                 "raw_fallback_blocks": s["raw_blocks"]}
                for j, (i, s) in enumerate(per)
            ]
        return out
