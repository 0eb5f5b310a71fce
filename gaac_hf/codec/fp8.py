"""Reference GAAC codec for FP8 tiles (format v3, E4M3 and E5M2): the executable spec of
``docs/FORMAT_V3.md`` "FP8 tiles".

Lossless contract: for every FP8 code (all 256 byte patterns of either format: NaNs, E5M2's +-Inf, +-0,
subnormals, the largest exponents) ``decode_pool_fp8(pack_blocks(encode_blocks_fp8(x, ...), x), ...)``
returns the same bytes. The only approximation of an FP8 cache is the BF16 -> FP8 conversion before it
(:func:`quantize_fp8`: ``(x.float() / scale).to(torch.float8_e4m3fn | torch.float8_e5m2)``, exactly what
transformers' fp8 quantized cache does); the codec never sees the scale.

Shapes: N blocks, T = block_size tokens, D = head_dim, C = chunks per block (4 rows x 8 channels), G = 4C
groups. FP8 blocks are given as uint8 ``[N, T, D]`` (the codes) or as a float8 tensor of that dtype.

Layout reused from the BF16 v3 codec (``codec.v3``): the chunk order, the pair-packed 3-bit code words,
the segment table and the entry list (``write_listing`` / ``_apply_entries``, with FP8's raw bytes and
exponent width). New here: the sign/mantissa plane and the exponent windows of the narrower field.
"""
from __future__ import annotations

import torch

from ..format.fp8 import NARROW_BITS, RAW_BYTE_BITS, TORCH_DTYPES, WIDE_BITS, GeometryFP8
from ..format.v3 import ALIGN, CHUNK_ROWS, CODE_WORDS, ENTRY_RAW, GROUP, MODE_3BIT, MODE_4BIT, MODE_RAW
from .v3 import (
    EncodedBlocksV3, _apply_entries, _gather_u32, chunk_bases, code_word_index, from_chunks, to_chunks,
    unpack_code_words, write_listing,
)

#: one encoder output type for both tile kinds: ``data`` rows are ``geometry.raw_bytes`` (= T*D for FP8)
EncodedBlocksFP8 = EncodedBlocksV3


def torch_dtype(geometry: GeometryFP8) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES[geometry.dtype])


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | float, dtype: str, saturate: bool = False) -> torch.Tensor:
    """The BF16 -> FP8 conversion of an FP8 KV cache: ``(x.float() / scale).to(fp8)``, torch's rounding
    (to nearest even) and its handling past the largest finite value (torch 2.13 on the CPU: E4M3
    saturates to +-448, E5M2 gives +-Inf), whatever it is: the codec stores every code the same way.

    Args:
        x: BF16 (or any float) ``[..., H, S, D]``.
        scale: a float32 scalar (per tensor, as transformers' ``Fp8QuantizedLayer`` and vLLM's
            ``k_scale`` / ``v_scale``) or ``[H]`` (per kv-head), broadcast over S and D.
        dtype: ``"fp8_e4m3"`` or ``"fp8_e5m2"``.
        saturate: clamp ``x / scale`` to +-max finite first (NaN stays NaN), as vLLM's cache conversion
            does (``__NV_SATFINITE``) and as torch's E4M3 cast already does: then E5M2 has no overflow to
            +-Inf either, which in a live cache would turn attention into NaN for every later layer. The
            FP8 caches (:mod:`gaac_hf.cache.fp8`, :mod:`gaac_hf.cache.fp8_baseline`) convert with it;
            the default (False) is the plain cast the FP8 compression reports measured.
    Returns: uint8 codes, same shape.
    """
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if s.dim() == 1:
        if x.dim() < 3 or s.shape[0] != x.shape[-3]:
            raise ValueError(f"a per-head scale must have one entry per kv-head ({x.shape[-3] if x.dim() >= 3 else '?'}), got {tuple(s.shape)}")
        s = s[:, None, None]
    elif s.dim() != 0:
        raise ValueError(f"scale must be a scalar or [H], got {tuple(s.shape)}")
    fp8 = getattr(torch, TORCH_DTYPES[dtype])
    y = x.float() / s
    if saturate:
        fmax = torch.finfo(fp8).max
        y = y.clamp(-fmax, fmax)
    return y.to(fp8).view(torch.uint8)


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor | float, dtype: str,
                   out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What attention reads from an FP8 KV cache: ``(codes.view(fp8).float() * scale).to(out_dtype)``,
    the dequantization of transformers' ``Fp8QuantizedLayer`` (float32 product, one rounding to ``out_dtype``).

    Args:
        codes: uint8 ``[..., H, S, D]`` FP8 codes of ``dtype``.
        scale: the float32 scalar the codes were made with (:func:`quantize_fp8`).
    Returns: ``out_dtype`` tensor of the same shape.
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"dequantize_fp8 reads uint8 FP8 codes, got {codes.dtype}")
    s = torch.as_tensor(scale, dtype=torch.float32, device=codes.device)
    if s.dim() != 0:
        raise ValueError(f"dequantize_fp8 takes a per-tensor (scalar) scale, got {tuple(s.shape)}")
    return (codes.view(getattr(torch, TORCH_DTYPES[dtype])).float() * s).to(out_dtype)


def fp8_scale(x: torch.Tensor, dtype: str, per_head: bool = False) -> torch.Tensor:
    """The amax scale transformers' fp8 cache calibrates: ``amax(|x|) / max_finite`` (per tensor, or per
    kv-head over ``[..., H, S, D]``), clamped away from 0. float32."""
    fmax = torch.finfo(getattr(torch, TORCH_DTYPES[dtype])).max
    a = x.abs().float()
    amax = a.transpose(0, -3).reshape(x.shape[-3], -1).amax(-1) if per_head else a.amax()
    return (amax / fmax).clamp(min=torch.finfo(torch.float32).tiny)


def _codes(x: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    if isinstance(x, torch.Tensor) and x.dtype == torch_dtype(g):
        x = x.view(torch.uint8)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8:
        raise TypeError(f"{g.dtype} tiles encode uint8 codes or {torch_dtype(g)} tensors, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 3 or tuple(x.shape[1:]) != (g.block_size, g.head_dim):
        raise ValueError(f"expected blocks of shape [N, {g.block_size}, {g.head_dim}], got {tuple(x.shape)}")
    return x


def split_fp8(codes: torch.Tensor, g: GeometryFP8) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 codes -> (int32 exponent field, int32 sign<<M | mantissa), same shape."""
    c = codes.to(torch.int32)
    m = g.man_bits
    return (c >> m) & ((1 << g.exp_bits) - 1), ((c >> 7) << m) | (c & ((1 << m) - 1))


def join_fp8(exponent: torch.Tensor, sm: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    m = g.man_bits
    return (((sm >> m) << 7) | (exponent << m) | (sm & ((1 << m) - 1))).to(torch.uint8)


def check_bases(base_n: torch.Tensor, base_w: torch.Tensor, g: GeometryFP8) -> None:
    """Window starts of an FP8 table: uint8, base_n <= 2**E - 8, base_w <= 2**E - 16 (E4M3: 0)."""
    for name, b, hi in (("base_n", base_n, g.max_base_narrow), ("base_w", base_w, g.max_base_wide)):
        if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8:
            raise TypeError(f"{name} must be uint8 exponent bases, got {getattr(b, 'dtype', type(b))}")
        if b.numel() and int(b.max()) > hi:
            raise ValueError(f"{g.dtype} window bases out of range: {name} <= {hi}, got {int(b.max())}")


def group_modes_fp8(e: torch.Tensor, bn: torch.Tensor, bw: torch.Tensor) -> torch.Tensor:
    """int32 [..., 8] exponents with their bases -> int32 [...] mode (narrow 0, wide 1, raw 2)."""
    on, ow = e - bn, e - bw
    fit_n = ((on >= 0) & (on < (1 << NARROW_BITS))).all(-1)
    fit_w = ((ow >= 0) & (ow < (1 << WIDE_BITS))).all(-1)
    return torch.where(fit_n, MODE_3BIT, torch.where(fit_w, MODE_4BIT, MODE_RAW)).to(torch.int32)


def pack_sm(sm: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    """int32 [N, C, 4, 8] sign/mantissa fields -> uint8 [N, C * sm_chunk_bytes]: value k = 8r + j of a
    chunk at bits (1+M)k .. (1+M)k + M of the chunk's little-endian record."""
    n, b = sm.shape[0], g.sm_bits
    v = sm.reshape(n, g.chunks, -1).to(torch.int64)  # [N, C, 32]
    bitpos = torch.arange(v.shape[-1], device=sm.device) * b  # [32]
    out = torch.zeros(n, g.chunks, g.sm_chunk_bytes, dtype=torch.int64, device=sm.device)
    for k in range(b):  # bit k of every field
        pos = bitpos + k
        out.scatter_add_(2, (pos // 8).expand_as(v), ((v >> k) & 1) << (pos % 8))
    return out.to(torch.uint8).reshape(n, -1)


def unpack_sm(data: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    """Inverse of :func:`pack_sm`: uint8 [M, C * sm_chunk_bytes] -> int32 [M, C, 4, 8]."""
    m, b = data.shape[0], g.sm_bits
    rec = data.reshape(m, g.chunks, g.sm_chunk_bytes).to(torch.int32)
    bitpos = torch.arange(CHUNK_ROWS * GROUP, device=data.device) * b
    out = torch.zeros(m, g.chunks, CHUNK_ROWS * GROUP, dtype=torch.int32, device=data.device)
    for k in range(b):
        pos = bitpos + k
        out |= ((rec[:, :, pos // 8] >> (pos % 8)) & 1) << k
    return out.reshape(m, g.chunks, CHUNK_ROWS, GROUP)


def encode_blocks_fp8(x: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor, geometry: GeometryFP8) -> EncodedBlocksFP8:
    """Encode N FP8 blocks.

    Args:
        x: uint8 codes (or the float8 tensor) ``[N, T, D]``.
        base_n, base_w: uint8 ``[D]`` or ``[N, D]`` window starts (narrow: 8 exponents, wide: 16).
        geometry: the FP8 block geometry (its ``dtype`` says E4M3 or E5M2).
    Returns: rows of ``geometry.raw_bytes`` (= T * D) bytes, lengths, ``fits``, the group modes.
    """
    g = geometry
    x = _codes(x, g)
    check_bases(base_n, base_w, g)
    n, dev, cap = x.shape[0], x.device, g.raw_bytes
    bn, bw = chunk_bases(base_n, n, g, "base_n"), chunk_bases(base_w, n, g, "base_w")
    e, sm = split_fp8(x.contiguous(), g)
    e, sm = to_chunks(e, g), to_chunks(sm, g)  # [N, C, 4, 8]
    mode = group_modes_fp8(e, bn, bw)
    coded = torch.where((mode == MODE_3BIT)[..., None], e - bn, (e - bw) & ((1 << g.exp_bits) - 1))
    rows = torch.zeros(n, cap + 1, dtype=torch.uint8, device=dev)
    rows[:, : g.code_offset] = pack_sm(sm, g)
    nbytes = write_listing(rows, coded, mode, g, raw_word_bytes=1, raw_bits=RAW_BYTE_BITS)
    fits = nbytes <= cap
    modes = from_chunks(mode.unsqueeze(-1).expand(*mode.shape, GROUP), g)[..., ::GROUP].contiguous()
    return EncodedBlocksFP8(rows[:, :cap].contiguous(), nbytes.to(torch.int32), fits, modes)


def decode_pool_fp8(pool: torch.Tensor, entries: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor,
                    geometry: GeometryFP8, *, validate: bool = True) -> torch.Tensor:
    """Decode N FP8 blocks of a pool through their block-table entries (``codec.v3.pack_blocks``: offset,
    ``| 1`` for a block stored as its T*D FP8 bytes). Returns uint8 codes ``[N, T, D]``."""
    g = geometry
    if not isinstance(g, GeometryFP8):
        raise TypeError(f"decode_pool_fp8 reads FP8 tiles; got a {type(g).__name__} (BF16 tiles: codec.v3.decode_pool_v3)")
    if pool.dtype != torch.uint8 or pool.dim() != 1:
        raise ValueError(f"pool must be uint8 [M], got {pool.dtype} {tuple(pool.shape)}")
    if entries.dim() != 1 or entries.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"entries must be int [N], got {entries.dtype} {tuple(entries.shape)}")
    check_bases(base_n, base_w, g)
    n, dev = entries.shape[0], pool.device
    entries = entries.to(dev, torch.int64)
    start = entries & ~(ALIGN - 1)
    is_raw = (entries & ENTRY_RAW).bool()
    if validate and n and (bool((entries & (ALIGN - 1) & ~ENTRY_RAW).any()) or int(start.min()) < 0):
        raise ValueError("corrupt GAAC FP8 block table: entries must be 16-byte offsets (+1 for raw blocks)")
    out = torch.empty(n, g.block_size, g.head_dim, dtype=torch.uint8, device=dev)
    ar = torch.arange(g.numel, device=dev)
    if bool(is_raw.any()):
        st = start[is_raw][:, None] + ar
        if validate and int(st.max()) >= pool.numel():
            raise ValueError("corrupt GAAC FP8 block table: a raw block runs past the pool")
        out[is_raw] = pool[st].reshape(-1, g.block_size, g.head_dim)
    c = ~is_raw
    if bool(c.any()):
        st = start[c]
        m = st.shape[0]
        if validate and int(st.max()) + g.fixed_bytes > pool.numel():
            raise ValueError("corrupt GAAC FP8 block: block runs past the pool")
        smb = pool[torch.clamp(st[:, None] + torch.arange(g.code_offset, device=dev), max=max(pool.numel() - 1, 0))]
        sm = unpack_sm(smb, g)
        widx = g.code_offset + 4 * code_word_index(g, dev).reshape(-1)
        lo3 = unpack_code_words(_gather_u32(pool, st[:, None] + widx).reshape(m, g.chunks, CODE_WORDS))
        bn = chunk_bases(base_n if base_n.dim() == 1 else base_n[c], m, g, "base_n")
        bw = chunk_bases(base_w if base_w.dim() == 1 else base_w[c], m, g, "base_w")
        e = _apply_entries(pool, st, bn + lo3, lo3, bw, g, validate, raw_word_bytes=1, raw_bits=RAW_BYTE_BITS,
                           exp_mask=(1 << g.exp_bits) - 1)
        out[c] = from_chunks(join_fp8(e, sm, g), g)
    return out


def decode_blocks_fp8(data: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor, geometry: GeometryFP8,
                      *, validate: bool = True) -> torch.Tensor:
    """Decode encoder rows ``data`` uint8 ``[N, W]`` (block i at the start of row i, W a multiple of 16)
    as compressed FP8 blocks. Returns uint8 codes ``[N, T, D]``."""
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % ALIGN:
        raise ValueError(f"data must be uint8 [N, W] with W a multiple of {ALIGN}, got {data.dtype} {tuple(data.shape)}")
    n, w = data.shape
    entries = torch.arange(n, device=data.device, dtype=torch.int64) * w
    return decode_pool_fp8(data.reshape(-1), entries, base_n, base_w, geometry, validate=validate)


def choose_windows_fp8(hist: torch.Tensor, g: GeometryFP8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel windows from exponent histograms ``int64 [..., 2**E]``: the 8- and 16-wide windows
    covering the most values (ties: lowest start). E4M3's wide window is the whole field (base_w = 0).
    Returns (base_n, base_w) uint8 ``[...]``."""
    if hist.shape[-1] != 1 << g.exp_bits:
        raise ValueError(f"{g.dtype} histograms have {1 << g.exp_bits} bins, got {tuple(hist.shape)}")
    c = torch.cat([torch.zeros_like(hist[..., :1]), hist.to(torch.int64).cumsum(-1)], -1)
    out = []
    for w in (1 << NARROW_BITS, 1 << WIDE_BITS):
        out.append((c[..., w:] - c[..., :-w]).argmax(-1).to(torch.uint8))
    return out[0], out[1]


def exponent_histogram_fp8(codes: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    """uint8 codes ``[..., S, D]`` -> int64 ``[..., D, 2**E]`` exponent-field histogram per channel."""
    e = split_fp8(codes, g)[0].transpose(-1, -2)  # [..., D, S]
    bins = 1 << g.exp_bits
    flat = e.reshape(-1, e.shape[-1])
    offs = torch.arange(flat.shape[0], device=codes.device).unsqueeze(-1) * bins
    return torch.bincount((flat + offs).reshape(-1), minlength=flat.shape[0] * bins).reshape(*e.shape[:-1], bins)


__all__ = [
    "EncodedBlocksFP8", "MODE_3BIT", "MODE_4BIT", "MODE_RAW", "choose_windows_fp8", "decode_blocks_fp8", "decode_pool_fp8",
    "dequantize_fp8",
    "encode_blocks_fp8", "exponent_histogram_fp8", "fp8_scale", "join_fp8", "pack_sm", "quantize_fp8", "split_fp8",
    "unpack_sm",
]
