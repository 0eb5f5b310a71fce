"""FP8 KV caches with GAAC on top: ``GAACCache(..., kv_dtype="fp8_e4m3" | "fp8_e5m2")``.

Per full-attention layer and kind (K/V), shapes with B = batch rows, H = kv-heads, T = block size,
D = head_dim:

* conversion: ``codes = quantize_fp8(x, scale)`` with the table's static per-(layer, K/V) scale, the
  conversion of :class:`~gaac_hf.cache.fp8_baseline.FP8DynamicCache` (the only approximation);
* ``tail``  uint8 ``[B, H, tl, D]``: the codes of the last, incomplete block;
* ``pool``  (:class:`_PoolFP8`) uint8 ``[cap]``: every completed block encoded once as a format v3 FP8
  tile (``docs/FORMAT_V3.md`` "FP8 tiles"), back to back at 16-byte offsets, or its T*D codes when the
  tile would not be smaller;
* ``table`` int64 ``[B, H, blocks]``: each block's pool offset, ``| 1`` for a block stored as codes.

Reading: :meth:`GAACFP8Layer.codes` decodes the blocks (reference codec, bit-exact) and appends the
tail; ``update()`` returns ``dequantize_fp8(codes)`` for K and V, ``[B, H, S, D]``, exactly what the
baseline returns, with the codes stored by earlier steps decoded from the pool and this step's own
codes taken from its input (as :class:`~gaac_hf.cache.GAACLayer` does: a prefill decodes nothing). Any attention function works (the registered ``gaac`` attention sees ordinary
tensors and runs SDPA). There is no attention over compressed FP8 tiles yet. On a CUDA device the
layer stores with the reference codec (PyTorch ops on the device) and decodes with the FP8 CUDA decoder
(``kernels/cuda/codec_fp8.py``) where it loads (bit-identical generation to the FP8 baseline on the
H200: ``tests/test_cache_fp8_gpu.py``, session 13).

Crop, beam reorder and batch selection re-index the tables and the tail; blocks no row references any
more stay in the pool until the cache is dropped (they are counted in ``allocated_bytes``).
"""
from __future__ import annotations

import torch

from ..calibration.fp8 import FP8Table
from ..codec.fp8 import decode_pool_fp8, dequantize_fp8, encode_blocks_fp8, quantize_fp8
from ..codec.v3 import pack_blocks
from ..format.fp8 import GeometryFP8
from ..format.v3 import MODE_3BIT, MODE_4BIT, MODE_RAW
from . import reserve
from .fp8_baseline import FP8DynamicLayer
from ..kernels.paged import PagedTensorV3
from .layer import _BlockedLayer

_K, _V = 0, 1
#: CPU pools grow in pages of this many bytes (never by doubling)
POOL_PAGE = 16 << 10
#: readable bytes past the last block (the CUDA decoder's vector loads may read that far)
GUARD = PagedTensorV3.GUARD_BYTES


def _cuda_codec():
    """The FP8 CUDA codec module, or None (not importable or no usable toolchain)."""
    try:
        from ..kernels.cuda import codec_fp8
    except Exception:  # noqa: BLE001 - an optional backend must never break the cache
        return None
    return codec_fp8 if codec_fp8.why_unavailable() is None else None


class _PoolFP8(reserve.DeepcopyReserved):
    """FP8 tiles of one kind of one layer. ``base_n``, ``base_w``: uint8 ``[H, D]`` windows."""

    def __init__(self, geometry: GeometryFP8, base_n: torch.Tensor, base_w: torch.Tensor, device) -> None:
        self.geometry = geometry
        self.base_n, self.base_w = base_n.to(device), base_w.to(device)
        self.pool = torch.zeros(0, dtype=torch.uint8, device=device)
        self.used = 0
        self.cuda = _cuda_codec() if torch.device(device).type == "cuda" else None
        self.modes = torch.zeros(3, dtype=torch.int64)  # groups in narrow / wide / raw mode, over every block stored
        self.raw_blocks = 0  # blocks stored as their codes (the tile would not be smaller)
        self.blocks = 0

    def store(self, blocks: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Encode uint8 codes ``[N, T, D]`` (``heads`` int64 ``[N]``: each block's kv-head) and append
        them; returns their int64 table entries ``[N]``."""
        g = self.geometry
        enc = encode_blocks_fp8(blocks, self.base_n[heads], self.base_w[heads], g)
        data, entries = pack_blocks(enc, blocks, start=self.used)
        need = self.used + data.numel()
        if need + GUARD > self.pool.numel():
            cap = -(-(need + GUARD) // POOL_PAGE) * POOL_PAGE
            if reserve.enabled(self.pool.device):  # CPU: in place, the history not copied (gaac_hf.cache.reserve)
                self.pool = reserve.grow_or_copy(self.pool, cap)
            else:
                grown = torch.zeros(cap, dtype=torch.uint8, device=self.pool.device)
                grown[: self.used] = self.pool[: self.used]
                self.pool = grown
        self.pool[self.used : need] = data
        self.used = need
        self.blocks += blocks.shape[0]
        self.raw_blocks += int((~enc.fits).sum())
        self.modes += torch.bincount(enc.modes.reshape(-1).cpu(), minlength=3)[:3]
        return entries

    def gather(self, entries: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Decode table entries int64 ``[N]`` -> uint8 codes ``[N, T, D]``, bit-exact (structure checked)."""
        g = self.geometry
        if entries.numel() == 0:
            return torch.empty(0, g.block_size, g.head_dim, dtype=torch.uint8, device=self.pool.device)
        if self.cuda is not None:  # the whole pool: GUARD readable bytes follow the last block
            return self.cuda.decode_pool_fp8_cuda(self.pool, entries, self.base_n[heads], self.base_w[heads], g)
        try:
            return decode_pool_fp8(self.pool[: self.used], entries, self.base_n[heads], self.base_w[heads], g)
        except ValueError as err:
            raise ValueError(f"corrupt GAAC FP8 cache: {err}") from None


class GAACFP8Layer(_BlockedLayer):
    """A full-attention layer of an FP8 ``GAACCache`` (see the module docstring).

    Args:
        layer_idx: the decoder layer.
        table: the model's :class:`~gaac_hf.calibration.fp8.FP8Table` (scales and windows).
        geometry: the FP8 tile geometry (block size, head_dim, FP8 format).
    """

    def __init__(self, layer_idx: int, table: FP8Table, geometry: GeometryFP8) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.geometry = geometry
        self.kv_dtype = geometry.dtype
        self._table = table
        self.scales = (table.scale(layer_idx, _K), table.scale(layer_idx, _V))
        self.format_version = 3
        self._reset_state()

    def _reset_state(self) -> None:
        self.is_initialized = False
        self.pools: list[_PoolFP8] | None = None
        self.tables: list[torch.Tensor] | None = None  # K and V, int64 [B, H, num_blocks]
        self.tails: list[torch.Tensor] | None = None  # K and V, uint8 [B, H, tail_len, D]
        self.num_blocks = 0

    def __repr__(self) -> str:
        return f"GAACFP8Layer(layer={self.layer_idx}, {self.kv_dtype}, tokens={self.get_seq_length()})"

    @property
    def tail_len(self) -> int:
        return self.tails[_K].shape[2] if self.is_initialized else 0

    # -- transformers layer API -------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        dev = key_states.device
        if d != self.geometry.head_dim:
            raise ValueError(f"layer {self.layer_idx}: KV head_dim {d} does not match the FP8 table's {self.geometry.head_dim}")
        if h != self._table.num_kv_heads:
            raise ValueError(f"layer {self.layer_idx}: KV of {h} kv-heads does not match the FP8 table's "
                             f"{self._table.num_kv_heads} (FP8 GAAC caches do not shard across tensor-parallel ranks yet)")
        self.device = dev
        self.out_dtype = key_states.dtype
        self.pools = [_PoolFP8(self.geometry, *self._table.bases(self.layer_idx, kind), dev) for kind in (_K, _V)]
        self.tables = [torch.zeros(b, h, 0, dtype=torch.int64, device=dev) for _ in (_K, _V)]
        self.tails = [torch.zeros(b, h, 0, d, dtype=torch.uint8, device=dev) for _ in (_K, _V)]
        self._heads = torch.arange(h, device=dev)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[B, H, q, D]`` K/V (converted to FP8); return the dequantized cache, ``[B, H, S, D]`` each."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = (quantize_fp8(key_states, self.scales[_K], self.kv_dtype, saturate=True),
               quantize_fp8(value_states, self.scales[_V], self.kv_dtype, saturate=True))
        # what was stored before this step, decoded, then this step's codes as they are: the blocks this
        # append encodes are not decoded right back (same bits, the codec is lossless; a prefill decodes nothing)
        before = [self.codes(kind) for kind in (_K, _V)]
        self.append_codes(*new)
        return tuple(dequantize_fp8(torch.cat([before[kind], new[kind]], dim=2), self.scales[kind], self.kv_dtype,
                                    self.out_dtype) for kind in (_K, _V))

    def take_over(self, src) -> None:
        """Store what another cache layer holds: an :class:`~gaac_hf.cache.fp8_baseline.FP8DynamicLayer`'s
        codes as they are (same format and scales required: the codes mean nothing under others), any
        other layer's ``keys`` / ``values`` ``[B, H, S, D]`` converted as :meth:`update` converts them."""
        if not isinstance(src, FP8DynamicLayer):
            self.update(src.keys, src.values)
            return
        same = src.kv_dtype == self.kv_dtype and all(
            torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(src.scales, self.scales))
        if not same:
            raise ValueError(f"layer {self.layer_idx}: the FP8 layer holds {src.kv_dtype} codes with other scales than this "
                             "cache's table: build the GAACCache from the table the FP8DynamicCache was built with")
        empty = torch.zeros(*src.keys.shape[:2], 0, src.keys.shape[3], dtype=src.out_dtype, device=src.keys.device)
        self.lazy_initialization(empty, empty)
        self.append_codes(src.keys, src.values)

    def append_codes(self, key_codes: torch.Tensor, value_codes: torch.Tensor) -> None:
        """Store FP8 codes uint8 ``[B, H, q, D]``: into the tail; every block that fills is encoded once."""
        if not self.is_initialized:
            raise RuntimeError("append_codes before the first update(): the layer does not know its shape yet")
        for kind, new in ((_K, key_codes), (_V, value_codes)):
            if new.dtype != torch.uint8 or new.shape[:2] != self.tails[kind].shape[:2] or new.shape[3] != self.geometry.head_dim:
                raise ValueError(f"layer {self.layer_idx}: codes must be uint8 {tuple(self.tails[kind].shape[:2])} x q x "
                                 f"{self.geometry.head_dim}, got {new.dtype} {tuple(new.shape)}")
        t, d = self.geometry.block_size, self.geometry.head_dim
        seqs = [torch.cat([self.tails[kind], new], dim=2) for kind, new in ((_K, key_codes), (_V, value_codes))]
        b, h, n = seqs[0].shape[:3]
        nfull = n // t
        if nfull:
            heads = self._heads.view(1, h, 1).expand(b, h, nfull).reshape(-1)
            for kind in (_K, _V):
                blocks = seqs[kind][:, :, : nfull * t].reshape(b * h * nfull, t, d)
                entries = self.pools[kind].store(blocks, heads).view(b, h, nfull)
                self.tables[kind] = torch.cat([self.tables[kind], entries], dim=2)
            self.num_blocks += nfull
        self.tails = [s[:, :, nfull * t :].clone() for s in seqs]

    def codes(self, kind: int) -> torch.Tensor:
        """The stored FP8 codes of keys (kind 0) or values (1), uint8 ``[B, H, S, D]``, decoded bit-exact."""
        b, h = self.tails[kind].shape[:2]
        t, d = self.geometry.block_size, self.geometry.head_dim
        nb = self.num_blocks
        if nb == 0:
            return self.tails[kind]
        heads = self._heads.view(1, h, 1).expand(b, h, nb).reshape(-1)
        blocks = self.pools[kind].gather(self.tables[kind].reshape(-1), heads)
        return torch.cat([blocks.view(b, h, nb * t, d), self.tails[kind]], dim=2)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: rows follow ``beam_idx``; only table entries and the tail move."""
        if self.is_initialized:
            idx = beam_idx.to(self.device)
            self.tables = [tb.index_select(0, idx) for tb in self.tables]
            self.tails = [tl.index_select(0, idx) for tl in self.tails]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.tables = [tb.repeat_interleave(repeats, dim=0) for tb in self.tables]
            self.tails = [tl.repeat_interleave(repeats, dim=0) for tl in self.tails]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            if isinstance(indices, torch.Tensor):
                indices = indices.to(self.device)
            self.tables = [tb[indices] for tb in self.tables]
            self.tails = [tl[indices] for tl in self.tails]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (a negative count, as transformers >= 5.18 passes
        it). Cropping into encoded history decodes the block that becomes incomplete back into the tail."""
        tokens_to_remove = int(tokens_to_remove)
        if tokens_to_remove > 0:
            raise ValueError(f"Calling `crop` with a positive value (`{tokens_to_remove}`) is not supported. "
                             "Please use a negative integer to remove that number of tokens from the cache instead.")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        t = self.geometry.block_size
        new_len = max(self.get_seq_length() + tokens_to_remove, 0)
        if new_len >= self.num_blocks * t:
            self.tails = [tl[:, :, : new_len - self.num_blocks * t].clone() for tl in self.tails]
            return
        keep, rem = divmod(new_len, t)
        full = [self.codes(kind)[:, :, keep * t : new_len].clone() for kind in (_K, _V)]
        self.tables = [tb[:, :, :keep].clone() for tb in self.tables]
        self.tails, self.num_blocks = full, keep

    # -- statistics -------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Host-side byte counts of this layer: ``resident`` (tiles in use + table entries + tails),
        ``fp8`` (what the FP8 baseline holds for the same tokens: 1 byte per value), ``allocated``
        (pool capacity included), ``modes`` int64 ``[2, 3]`` (K/V groups per mode), ``raw_blocks``."""
        if not self.is_initialized:
            return {"resident": 0, "fp8": 0, "allocated": 0, "modes": torch.zeros(2, 3, dtype=torch.int64), "raw_blocks": 0,
                    "blocks": 0, "tokens": 0, "tail_tokens": 0}
        b, h = self.tails[_K].shape[:2]
        entries = sum(tb.numel() * tb.element_size() for tb in self.tables)
        tails = sum(tl.numel() for tl in self.tails)
        return {
            "resident": sum(p.used for p in self.pools) + entries + tails,
            "fp8": 2 * b * h * self.get_seq_length() * self.geometry.head_dim,
            "allocated": sum(reserve.held_bytes(p.pool) for p in self.pools) + entries + tails,
            "modes": torch.stack([p.modes for p in self.pools]),
            "raw_blocks": sum(p.raw_blocks for p in self.pools),
            "blocks": sum(p.blocks for p in self.pools),
            "tokens": self.get_seq_length(),
            "tail_tokens": self.tail_len,
        }


def fp8_cache_stats(layers: list) -> dict:
    """``GAACCache.stats()`` of an FP8 cache: bytes against the FP8 baseline and against BF16."""
    per = [layer.stats() for layer in layers if isinstance(layer, GAACFP8Layer)]
    modes = torch.stack([s["modes"] for s in per]).sum(0)  # [2, 3]
    resident, fp8 = sum(s["resident"] for s in per), sum(s["fp8"] for s in per)
    allocated = sum(s["allocated"] for s in per)

    def shares(c: torch.Tensor) -> dict:
        tot = max(int(c.sum()), 1)
        return {"3bit": int(c[MODE_3BIT]) / tot, "4bit": int(c[MODE_4BIT]) / tot, "raw": int(c[MODE_RAW]) / tot}

    first = next(layer for layer in layers if isinstance(layer, GAACFP8Layer))
    return {
        "kv_dtype": first.kv_dtype,
        "resident_bytes": resident,
        "fp8_bytes": fp8,
        "bf16_bytes": 2 * fp8,
        "ratio_vs_fp8": fp8 / resident if resident else 0.0,
        "ratio": 2 * fp8 / resident if resident else 0.0,
        "allocated_bytes": allocated,
        "allocated_vs_fp8": allocated / fp8 if fp8 else 0.0,
        "mode_shares": shares(modes.sum(0)),
        "mode_shares_k": shares(modes[_K]),
        "mode_shares_v": shares(modes[_V]),
        "raw_fallback_blocks": sum(s["raw_blocks"] for s in per),
        "encoded_blocks": sum(s["blocks"] for s in per),
        "stored_blocks": sum(s["blocks"] for s in per),
        "tail_tokens": per[0]["tail_tokens"],
        "seq_length": per[0]["tokens"],
        "block_size": first.geometry.block_size,
        "format_version": 3,
    }
