"""GPU launchers of the v3 CUDA kernels (kernels/cuda/gaac_v3/kernels.cu), compiled at run time by NVRTC.

Compiled and launched through the package's CUDA toolchain (``runtime``: NVRTC via ``cuda.core``, the
disk cache, PyTorch's current stream, no host synchronisation). The kernel source includes its
neighbour ``core.cuh``, the one copy of the bit logic (the tests also compile it with g++); no CUDA
toolkit headers are needed.

Shapes: N blocks, T = block_size, D = head_dim. Bases: uint8 ``[D]`` (shared) or ``[N, D]``.
"""
from __future__ import annotations


import torch

from gaac_hf.codec.v3 import EncodedBlocksV3
from gaac_hf.format.fp8 import FP8_TYPES, GeometryFP8
from gaac_hf.format.v3 import ALIGN, GeometryV3

from . import runtime

DECODE_THREADS = 128  # kernels.cu's DECODE_THREADS default (4 warps: staged 4-segment windows in 32 KB)


SOURCE = "gaac_v3/kernels.cu"  # includes its neighbour core.cuh: the one copy of the bit logic


def why_unavailable() -> str | None:
    return runtime.why_unavailable()


def _defines(block_t: int, head_dim: int, fp8: int = 0) -> dict:
    """kernels.cu's -D parameters; fp8 = 1 (E4M3) or 2 (E5M2) builds its FP8-tile kernels (``codec_fp8``)."""
    return dict(BLOCK_T=block_t, HEAD_DIM=head_dim) | (dict(GAAC_FP8=fp8) if fp8 else {})


def _fp8_id(g: GeometryV3) -> int:
    """0 for BF16 tiles, else the FP8 dtype id (the format's DTYPE_FP8_E4M3 = 1, DTYPE_FP8_E5M2 = 2)."""
    return FP8_TYPES[g.dtype][0] if isinstance(g, GeometryFP8) else 0


def compile_cubin(block_t: int, head_dim: int, arch: str) -> bytes:
    """NVRTC cubin of kernels.cu for one geometry and architecture (e.g. ``sm_90a``); needs no GPU.
    Through the package's CUDA toolchain (``runtime``), so it shares its disk cache and its key."""
    return runtime.compile_cubin(SOURCE, _defines(block_t, head_dim), arch)[0]


def _launch(g: GeometryV3, device: torch.device, name: str, grid: int, block: int, *args) -> None:
    import numpy as np

    mod = runtime.load(SOURCE, _defines(g.block_size, g.head_dim, _fp8_id(g)), device)
    conv = [np.int32(a) if isinstance(a, int) else a for a in args]
    runtime.launch(mod, name, (grid,), (block,), 0, *conv, device=device)


def _rows(base: torch.Tensor, g: GeometryV3) -> tuple[torch.Tensor, int]:
    if base.dtype != torch.uint8 or base.shape[-1] != g.head_dim or base.dim() not in (1, 2):
        raise ValueError(f"bases must be uint8 [D] or [N, D], got {base.dtype} {tuple(base.shape)}")
    b = base.reshape(-1, g.head_dim).contiguous()
    return b, (g.head_dim if b.shape[0] > 1 else 0)


def pair_tables(base8: torch.Tensor, base16: torch.Tensor, g: GeometryV3) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(b8p, dbp) int32 ``[Nb, D/2]``: pre-shifted pair constants of each channel pair (core.cuh
    ``pair_const``) of base8 and of (base16 - base8) mod 256, and the row stride in words (0 = shared)."""
    b8, stride = _rows(base8, g)
    b16, _ = _rows(base16, g)
    b8i, b16i = b8.to(torch.int64), b16.to(torch.int64)
    pc = lambda v: ((v[:, 0::2] & 0xFF) << 7) | ((v[:, 1::2] & 0xFF) << 23)  # noqa: E731
    to32 = lambda v: (v - ((v >> 31) << 32)).to(torch.int32).contiguous()  # noqa: E731
    return to32(pc(b8i)), to32(pc((b16i - b8i) & 0xFF)), stride // 2


def _grid(items: int, device: torch.device) -> int:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(-(-items // (DECODE_THREADS // 32)), 16 * sms))


def encode_blocks_cuda(x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, g: GeometryV3,
                       *, zero_fill: bool = True) -> EncodedBlocksV3:
    """CUDA twin of :func:`gaac_hf.codec.v3.encode_blocks_v3` (``modes`` is left empty).

    zero_fill: start from zeroed rows, so rows are byte-identical to the reference's in full (the
    kernel writes a block's bytes only up to nbytes); False skips the memset (a block's bytes are
    the same either way).
    """
    if x.dtype != torch.bfloat16 or x.dim() != 3 or tuple(x.shape[1:]) != (g.block_size, g.head_dim) or not x.is_cuda:
        raise ValueError(f"x must be CUDA bfloat16 [N, {g.block_size}, {g.head_dim}], got {x.dtype} {tuple(x.shape)}")
    n = x.shape[0]
    b8, s8 = _rows(base8.to(x.device), g)
    b16, _ = _rows(base16.to(x.device), g)
    alloc = torch.zeros if zero_fill else torch.empty
    rows = alloc(n, g.raw_bytes, dtype=torch.uint8, device=x.device)
    nbytes = torch.empty(n, dtype=torch.int32, device=x.device)
    if n:
        _launch(g, x.device, "gaac_v3_encode", n, 32 * g.segments, x.contiguous(), b8, b16, s8, rows, nbytes)
    return EncodedBlocksV3(rows, nbytes, nbytes <= g.raw_bytes, torch.empty(0, dtype=torch.int32, device=x.device))


def pack_blocks_cuda(rows: torch.Tensor, nbytes: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, pool: torch.Tensor,
                     g: GeometryV3) -> None:
    """Write encoded blocks into ``pool`` at device offsets ``offs`` (int64 ``[N]``, 16-byte multiples):
    row i's first ``nbytes[i]`` bytes, or block i's BF16 bytes (``x`` ``[N, T, D]``) where it does not
    fit. The same bytes as :func:`gaac_hf.codec.v3.pack_blocks` placed at ``offs``; no host sync."""
    n = rows.shape[0]
    if rows.shape[1:] != (g.raw_bytes,) or nbytes.shape != (n,) or offs.shape != (n,) or x.shape[0] != n:
        raise ValueError(f"pack: rows [N, {g.raw_bytes}], nbytes [N], offs [N] and x [N, T, D], got {tuple(rows.shape)}, "
                         f"{tuple(nbytes.shape)}, {tuple(offs.shape)}, {tuple(x.shape)}")
    if n:
        _launch(g, pool.device, "gaac_v3_pack", n, 256, rows.contiguous(), nbytes.to(torch.int32).contiguous(),
                x.contiguous().view(torch.uint8), offs.to(torch.int64).contiguous(), pool)


def decode_pool_cuda(pool: torch.Tensor, entries: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, g: GeometryV3,
                     *, out: torch.Tensor | None = None, tables=None) -> torch.Tensor:
    """CUDA twin of :func:`gaac_hf.codec.v3.decode_pool_v3`: BF16 ``[N, T, D]`` (into ``out`` if given).
    ``tables``: precomputed :func:`pair_tables` (skips their construction per call)."""
    n = entries.shape[0]
    if out is None:
        out = torch.empty(n, g.block_size, g.head_dim, dtype=torch.bfloat16, device=pool.device)
    b8p, dbp, stride = tables if tables is not None else pair_tables(base8.to(pool.device), base16.to(pool.device), g)
    if n:
        items = n * -(-g.segments // 4)
        _launch(g, pool.device, "gaac_v3_decode", _grid(items, pool.device), DECODE_THREADS, pool, entries.to(torch.int64).contiguous(),
                b8p, dbp, stride, out, n)
    return out


def decode_blocks_cuda(data: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, g: GeometryV3, **kw) -> torch.Tensor:
    """Decode encoder rows uint8 ``[N, W]`` (W a multiple of 16) as compressed blocks."""
    if data.shape[1] % ALIGN:
        raise ValueError(f"row width must be a multiple of {ALIGN}")
    entries = torch.arange(data.shape[0], device=data.device, dtype=torch.int64) * data.shape[1]
    return decode_pool_cuda(data.reshape(-1), entries, base8, base16, g, **kw)


def decode_reduce_cuda(pool: torch.Tensor, entries: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, g: GeometryV3,
                       *, tables=None, grid: int | None = None) -> torch.Tensor:
    """Decode every value and store none: int32 ``[grid]`` XOR folds (one per CTA) of all decoded
    32-bit BF16 pair words; their XOR equals the XOR of the blocks' words."""
    n = entries.shape[0]
    b8p, dbp, stride = tables if tables is not None else pair_tables(base8.to(pool.device), base16.to(pool.device), g)
    grid = grid or _grid(n * -(-g.segments // 4), pool.device)
    fold = torch.zeros(grid, dtype=torch.int32, device=pool.device)
    if n:
        _launch(g, pool.device, "gaac_v3_decode_reduce", grid, DECODE_THREADS, pool, entries.to(torch.int64).contiguous(), b8p, dbp,
                stride, fold, n)
    return fold


def xor_fold(x: torch.Tensor) -> int:
    """XOR of all 32-bit words of a tensor (the reference for :func:`decode_reduce_cuda`)."""
    w = x.contiguous().view(torch.int32).reshape(-1).to(torch.int64) & 0xFFFFFFFF
    while w.numel() > 1:
        if w.numel() % 2:
            w = torch.cat([w, w.new_zeros(1)])
        w = w[0::2] ^ w[1::2]
    return int(w[0]) if w.numel() else 0
