"""GPU launchers of the FP8-tile CUDA kernels (E4M3, E5M2): ``gaac_v3/kernels.cu`` built with
``-DGAAC_FP8=1 | 2``, compiled at run time by NVRTC.

The twins of :mod:`gaac_hf.codec.fp8` (``docs/FORMAT_V3.md`` "FP8 tiles"): encoder rows byte for byte,
decoded codes code for code. The kernels are the v3 kernels (``codec_v3``: the same lanes, launches,
pack and disk cache) with FP8's bit logic from ``core_fp8.cuh``, which the g++ tests check against the
reference; their names stay ``gaac_v3_encode`` / ``gaac_v3_decode`` / ``gaac_v3_pack`` inside the
FP8 module. There is no decode-and-reduce kernel for FP8 tiles.

Shapes: N blocks, T = block_size, D = head_dim. Codes: uint8 ``[N, T, D]`` (or the float8 tensor of the
geometry's dtype). Bases: uint8 ``base_n`` / ``base_w`` ``[D]`` (shared) or ``[N, D]``.
"""
from __future__ import annotations

import torch

from gaac_hf.codec.fp8 import EncodedBlocksFP8, torch_dtype
from gaac_hf.format.fp8 import GeometryFP8
from gaac_hf.format.v3 import ALIGN

from . import codec_v3, runtime
from .codec_v3 import DECODE_THREADS, SOURCE, _fp8_id, _grid, _launch, _rows, why_unavailable  # noqa: F401

__all__ = ["compile_cubin", "decode_blocks_fp8_cuda", "decode_pool_fp8_cuda", "encode_blocks_fp8_cuda",
           "pack_blocks_fp8_cuda", "pair_tables", "why_unavailable"]


def _geometry(g) -> GeometryFP8:
    if not isinstance(g, GeometryFP8):
        raise TypeError(f"the FP8 CUDA codec reads FP8 tiles; got a {type(g).__name__} (BF16 tiles: codec_v3)")
    return g


def compile_cubin(g: GeometryFP8, arch: str) -> bytes:
    """NVRTC cubin of the FP8 kernels for one geometry (its dtype) and architecture; needs no GPU."""
    g = _geometry(g)
    return runtime.compile_cubin(SOURCE, codec_v3._defines(g.block_size, g.head_dim, _fp8_id(g)), arch)[0]


def pair_tables(base_n: torch.Tensor, base_w: torch.Tensor, g: GeometryFP8) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(b8p, dbp, stride): the decoder's pair constants of base_n and of (base_w - base_n) mod 256,
    pre-shifted as BF16's (an FP8 exponent sits at the same lane bits, core_fp8.cuh)."""
    return codec_v3.pair_tables(base_n, base_w, _geometry(g))


def _codes(x: torch.Tensor, g: GeometryFP8) -> torch.Tensor:
    if x.dtype == torch_dtype(g):
        x = x.view(torch.uint8)
    if x.dtype != torch.uint8 or x.dim() != 3 or tuple(x.shape[1:]) != (g.block_size, g.head_dim) or not x.is_cuda:
        raise ValueError(f"x must be CUDA uint8 (or {torch_dtype(g)}) codes [N, {g.block_size}, {g.head_dim}], "
                         f"got {x.dtype} {tuple(x.shape)} on {x.device}")
    return x.contiguous()


def encode_blocks_fp8_cuda(x: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor, g: GeometryFP8,
                           *, zero_fill: bool = True) -> EncodedBlocksFP8:
    """CUDA twin of :func:`gaac_hf.codec.fp8.encode_blocks_fp8` (``modes`` is left empty).

    zero_fill: start from zeroed rows, so rows equal the reference's in full (the kernel writes a
    block's bytes only up to nbytes); False skips the memset (a block's bytes are the same either way).
    """
    g = _geometry(g)
    x = _codes(x, g)
    n = x.shape[0]
    bn, stride = _rows(base_n.to(x.device), g)
    bw, _ = _rows(base_w.to(x.device), g)
    rows = (torch.zeros if zero_fill else torch.empty)(n, g.raw_bytes, dtype=torch.uint8, device=x.device)
    nbytes = torch.empty(n, dtype=torch.int32, device=x.device)
    if n:
        _launch(g, x.device, "gaac_v3_encode", n, 32 * g.segments, x, bn, bw, stride, rows, nbytes)
    return EncodedBlocksFP8(rows, nbytes, nbytes <= g.raw_bytes, torch.empty(0, dtype=torch.int32, device=x.device))


def pack_blocks_fp8_cuda(rows: torch.Tensor, nbytes: torch.Tensor, x: torch.Tensor, offs: torch.Tensor,
                         pool: torch.Tensor, g: GeometryFP8) -> None:
    """Write encoded blocks into ``pool`` at device offsets ``offs`` (int64 ``[N]``, 16-byte multiples):
    row i's first ``nbytes[i]`` bytes, or block i's T*D codes where it does not fit; the bytes of
    :func:`gaac_hf.codec.v3.pack_blocks` placed at ``offs``, no host sync (``codec_v3.pack_blocks_cuda``
    with the FP8 build: rows of T*D bytes)."""
    codec_v3.pack_blocks_cuda(rows, nbytes, _codes(x, _geometry(g)), offs, pool, g)


def decode_pool_fp8_cuda(pool: torch.Tensor, entries: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor,
                         g: GeometryFP8, *, out: torch.Tensor | None = None, tables=None,
                         grid: int | None = None) -> torch.Tensor:
    """CUDA twin of :func:`gaac_hf.codec.fp8.decode_pool_fp8`: uint8 codes ``[N, T, D]`` (into ``out``
    if given). ``tables``: precomputed :func:`pair_tables`; ``grid``: CTAs of the grid-stride loop
    (default: enough for one warp per work item, at most 16 per SM)."""
    g = _geometry(g)
    n = entries.shape[0]
    if out is None:
        out = torch.empty(n, g.block_size, g.head_dim, dtype=torch.uint8, device=pool.device)
    if out.dtype != torch.uint8 or tuple(out.shape) != (n, g.block_size, g.head_dim) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous uint8 [{n}, {g.block_size}, {g.head_dim}], got {out.dtype} {tuple(out.shape)}")
    b8p, dbp, stride = tables if tables is not None else pair_tables(base_n.to(pool.device), base_w.to(pool.device), g)
    if n:
        items = n * -(-g.segments // 4)
        _launch(g, pool.device, "gaac_v3_decode", grid or _grid(items, pool.device), DECODE_THREADS, pool,
                entries.to(torch.int64).contiguous(), b8p, dbp, stride, out, n)
    return out


def decode_blocks_fp8_cuda(data: torch.Tensor, base_n: torch.Tensor, base_w: torch.Tensor, g: GeometryFP8,
                           **kw) -> torch.Tensor:
    """Decode encoder rows uint8 ``[N, W]`` (W a multiple of 16) as compressed FP8 blocks."""
    if data.shape[1] % ALIGN:
        raise ValueError(f"row width must be a multiple of {ALIGN}")
    entries = torch.arange(data.shape[0], device=data.device, dtype=torch.int64) * data.shape[1]
    return decode_pool_fp8_cuda(data.reshape(-1), entries, base_n, base_w, g, **kw)
