"""The CPU library (``gaac_cpu.cpp``): built with the system C++ compiler at first use, loaded with ctypes.

Why this mechanism: a plain shared library called through ``ctypes`` needs only a C++ compiler (g++ or
clang++, ``$CXX``), no Python headers, no ninja and no torch C++ headers, so it builds in ~3 s (two
cores) where a ``torch.utils.cpp_extension`` build takes about a minute; ctypes releases the GIL during
each call. The library is cached under ``$GAAC_HF_CACHE`` (default ``~/.cache/gaac_hf``), keyed on
the sources, the compiler and the CPU's flags (it is built with ``-march=native``), so the build
happens once per machine. Without a compiler (or with ``GAAC_HF_CPU_KERNELS=0``), :func:`library`
returns None, warns once why, and callers use the PyTorch reference (same bits, slower).

Every wrapper takes and returns torch CPU tensors; shapes are in each docstring.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CORE = HERE.parent / "cuda" / "gaac_v3"
SOURCES = (HERE / "gaac_cpu.cpp", CORE / "host_block.h", CORE / "core.cuh")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-fast-math", "-std=c++17", "-shared", "-fPIC", "-pthread")
#: OpenMP, when the compiler has it: the library's threads are then torch's own OpenMP pool
OPENMP = ("-fopenmp",)
ABI = 3

_LOCK = threading.Lock()
_STATE: dict = {}


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("g++") or shutil.which("clang++")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(cxx: str) -> Path:
    ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    h.update(" ".join((cxx, ver, *FLAGS, *OPENMP, _cpu_flags(), platform.machine())).encode())
    root = Path(os.environ.get("GAAC_HF_CACHE", Path.home() / ".cache" / "gaac_hf")) / "cpu"
    out = root / f"gaac_cpu-{h.hexdigest()[:16]}.so"
    if out.is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
    os.close(fd)
    try:
        cmd = [cxx, *FLAGS, f"-I{CORE}", "-o", tmp, str(HERE / "gaac_cpu.cpp")]
        try:
            subprocess.run([*cmd, *OPENMP], check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError:  # no OpenMP (e.g. Apple clang): std::thread instead
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(tmp, out)  # atomic: concurrent builds (test workers) each publish a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _declare(lib) -> None:
    P, I, L, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
    lib.gaac_cpu_abi.restype = I
    lib.gaac_v3_encode.argtypes = [I, I, I, P, P, P, P, P, I]
    lib.gaac_v3_encode.restype = None
    lib.gaac_v3_pack.argtypes = [I, I, I, P, P, P, P, P]
    lib.gaac_v3_pack.restype = None
    lib.gaac_v3_encode_kv.argtypes = [I] * 5 + [P, L, L, L] * 2 + [P, P, P, P, I]
    lib.gaac_v3_encode_kv.restype = None
    lib.gaac_v3_pack_kv.argtypes = [I] * 5 + [P, P] + [P, L, P, I] * 2 + [I]
    lib.gaac_v3_pack_kv.restype = None
    lib.gaac_v3_decode.argtypes = [I, I, I, P, L, P, P, P, P, P, I]
    lib.gaac_v3_decode.restype = L
    lib.gaac_v3_attention.argtypes = ([I] * 6 + [P] + [P, L, P, I, P, P, P] * 2 + [I, P, P, P, I, P, F, I, I, P, P])
    lib.gaac_v3_attention.restype = L


def library():
    """The loaded library, or None (no compiler, a failed build, or ``GAAC_HF_CPU_KERNELS=0``); the
    first None warns once with the reason. The build result is kept for the process."""
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]
        lib, why = None, None
        if os.environ.get("GAAC_HF_CPU_KERNELS", "1") == "0":
            why = "GAAC_HF_CPU_KERNELS=0"
        elif (cxx := _compiler()) is None:
            why = "no C++ compiler found (set $CXX or install g++)"
        else:
            try:
                lib = ctypes.CDLL(str(_build(cxx)))
                _declare(lib)
                if lib.gaac_cpu_abi() != ABI:
                    lib, why = None, "the cached library has another ABI"
            except (OSError, subprocess.CalledProcessError) as e:
                detail = getattr(e, "stderr", None) or str(e)
                lib, why = None, f"building kernels/cpu/gaac_cpu.cpp failed: {detail.strip()[-400:]}"
        if lib is None:
            warnings.warn(f"gaac_hf: the CPU kernels are not available ({why}); format v3 caches on the CPU use the "
                          "PyTorch reference codec and attention, which give the same bits but decode every block of "
                          "every layer at every step (many times slower at long contexts)", RuntimeWarning, stacklevel=3)
        _STATE["lib"] = lib
        return lib


def available() -> bool:
    return library() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(t: torch.Tensor, dtype, name: str) -> torch.Tensor:
    if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous CPU {dtype} tensor, got {t.device} {t.dtype}")
    return t


def threads() -> int:
    return max(torch.get_num_threads(), 1)


def encode_v3(x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode BF16 ``[N, T, D]`` blocks with uint8 ``[N, D]`` bases: (rows uint8 ``[N, 2*T*D]``, nbytes
    int32 ``[N]``), the bytes of ``gaac_hf.codec.v3.encode_blocks_v3`` (``.data``, ``.nbytes``)."""
    lib, g = library(), geometry
    n = x.shape[0]
    x = _check(x.contiguous(), torch.bfloat16, "x")
    b8, b16 = (_check(b.expand(n, g.head_dim).contiguous(), torch.uint8, "bases") for b in (base8, base16))
    rows = torch.empty(n, g.raw_bytes, dtype=torch.uint8)
    nbytes = torch.empty(n, dtype=torch.int32)
    lib.gaac_v3_encode(g.block_size, g.head_dim, n, _ptr(x), _ptr(b8), _ptr(b16), _ptr(rows), _ptr(nbytes), threads())
    return rows, nbytes


def pack_v3(rows: torch.Tensor, nbytes: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, pool: torch.Tensor, geometry) -> None:
    """Copy encoded blocks (or, where ``nbytes > 2*T*D``, their BF16 bytes from ``x``) to ``pool`` (uint8
    ``[P]``) at byte offsets ``offs`` (int64 ``[N]``; the caller sized the pool)."""
    g = geometry
    # the contiguous copy must outlive the call: a temporary inside the argument list is freed once its
    # data_ptr() is taken, and the library then copied freed memory into the pool (BF16 blocks of a
    # non-contiguous view lost bytes to the allocator's bookkeeping)
    x = _check(x.contiguous(), torch.bfloat16, "x")
    library().gaac_v3_pack(g.block_size, g.head_dim, rows.shape[0], _ptr(_check(rows, torch.uint8, "rows")),
                           _ptr(_check(nbytes, torch.int32, "nbytes")), _ptr(x),
                           _ptr(_check(offs, torch.int64, "offs")), _ptr(_check(pool, torch.uint8, "pool")))


def encode_kv(k: torch.Tensor, v: torch.Tensor, nfull: int, bases: torch.Tensor, geometry):
    """Encode the first ``nfull`` blocks of every (row, head) of K and V BF16 ``[B, H, S, D]`` (any
    strides with channels contiguous: no copy) with ``bases`` uint8 ``[2 kinds, 2 (base8, base16), H, D]``.
    Returns (rows uint8 ``[2, N, 2*T*D]``, nbytes int32 ``[2, N]``, stats int64 ``[2, 4]``): N = B*H*nfull
    blocks in (row, head, block) order; a row holds the block's encoded bytes, or its BF16 bytes where
    ``nbytes > 2*T*D``; stats per kind: bytes the blocks take in a pool, wide groups, raw groups, BF16 blocks."""
    g = geometry
    b, h = k.shape[:2]
    n = b * h * nfull
    if k.shape != v.shape or k.shape[2] < nfull * g.block_size or k.shape[3] != g.head_dim:
        raise ValueError(f"K {tuple(k.shape)} / V {tuple(v.shape)} do not hold {nfull} blocks of {g.block_size} x {g.head_dim}")
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    for x in (k, v):
        if x.device.type != "cpu" or x.dtype != torch.bfloat16:
            raise ValueError(f"K/V must be CPU bfloat16 tensors, got {x.device} {x.dtype}")
    rows = torch.empty(2, n, g.raw_bytes, dtype=torch.uint8)
    nbytes = torch.empty(2, n, dtype=torch.int32)
    stats = torch.empty(2, 4, dtype=torch.int64)
    library().gaac_v3_encode_kv(g.block_size, g.head_dim, b, h, nfull, _ptr(k), *k.stride()[:3], _ptr(v), *v.stride()[:3],
                                _ptr(_check(bases, torch.uint8, "bases")), _ptr(rows), _ptr(nbytes), _ptr(stats), threads())
    return rows, nbytes, stats


def pack_kv(rows: torch.Tensor, nbytes: torch.Tensor, stats: torch.Tensor, pools: tuple, used: tuple, tables: tuple,
            nb0: int, nfull: int, geometry) -> None:
    """Place :func:`encode_kv`'s blocks: kind k's back to back from byte ``used[k]`` of ``pools[k]`` (uint8,
    at least ``used[k] + stats[k, 0]`` bytes) and their entries (offset | 1 for BF16) into columns ``nb0 ..`` of
    ``tables[k]`` (int64 ``[B, H, max_blocks]``)."""
    g = geometry
    b, h, _ = tables[0].shape
    if rows.shape[1] != b * h * nfull:
        raise ValueError(f"{rows.shape[1]} encoded blocks for {b} x {h} x {nfull}")
    for pool, used_k, table, total in zip(pools, used, tables, stats[:, 0].tolist()):
        _check(pool, torch.uint8, "pool")
        _check(table, torch.int64, "table")
        if table.shape[:2] != (b, h) or table.shape[2] < nb0 + nfull or pool.numel() < used_k + total:
            raise ValueError("the pools or tables have no room for the blocks")
    library().gaac_v3_pack_kv(g.block_size, g.head_dim, b, h, nfull, _ptr(_check(rows, torch.uint8, "rows")),
                              _ptr(_check(nbytes, torch.int32, "nbytes")),
                              _ptr(pools[0]), int(used[0]), _ptr(tables[0]), tables[0].shape[2],
                              _ptr(pools[1]), int(used[1]), _ptr(tables[1]), tables[1].shape[2], int(nb0))


def decode_v3(pool: torch.Tensor, pool_bytes: int, entries: torch.Tensor, heads: torch.Tensor, b8p: torch.Tensor,
              dbp: torch.Tensor, geometry) -> torch.Tensor:
    """Decode blocks through int64 table ``entries`` ``[N]`` of kv-heads ``heads`` (int64 ``[N]``) with the
    pair constants int32 ``[H, D/2]`` -> BF16 ``[N, T, D]``. ``pool_bytes``: bytes of ``pool`` holding
    blocks (entries reaching past them are corrupt). Raises ValueError on a corrupt entry or block."""
    g = geometry
    n = entries.shape[0]
    out = torch.empty(n, g.block_size, g.head_dim, dtype=torch.bfloat16)
    entries, heads = (_check(t.contiguous(), torch.int64, name) for t, name in ((entries, "entries"), (heads, "heads")))
    bad = library().gaac_v3_decode(g.block_size, g.head_dim, n, _ptr(_check(pool, torch.uint8, "pool")), int(pool_bytes),
                                   _ptr(entries), _ptr(heads),
                                   _ptr(_check(b8p, torch.int32, "b8p")), _ptr(_check(dbp, torch.int32, "dbp")), _ptr(out), threads())
    if bad:
        raise ValueError(f"corrupt GAAC v3 cache: block-table entry {bad - 1} (value {int(entries[bad - 1])}) is not a "
                         "well-formed block inside the pool")
    return out


def attention_v3(query: torch.Tensor, kv, pool_bytes: tuple[int, int], scale: float, split_tiles: int,
                 mask: torch.Tensor | None = None, float_out: bool = False) -> torch.Tensor:
    """Tiled decode attention over a v3 :class:`~gaac_hf.kernels.paged.PagedKV` (arithmetic:
    :func:`gaac_hf.kernels.cpu.reference.tiled_attention_reference`).

    Args:
        query: BF16 ``[B, Hq, Sq, D]``; Hq a multiple of the kv-heads.
        kv: PagedKV with PagedTensorV3 ``k`` / ``v`` (tails of one capacity), ``num_blocks`` /
            ``tail_len`` int32 ``[B]``, optional ``kv_start`` int32 ``[B]``.
        pool_bytes: bytes of K's and V's pools holding blocks.
        mask: uint8 ``[B, Sq, L]`` (1 = attend) or None (bottom-right causal from ``kv_start``).
        float_out: return the float32 values before the final rounding (a finer bit-identity check).
    Returns:
        BF16 (or float32) ``[B, Sq, Hq, D]``.
    """
    g = kv.geometry
    b, hq, sq, d = query.shape
    h = kv.k.table.shape[1]
    q = _check(query.contiguous(), torch.bfloat16, "query")
    out = torch.empty(b, sq, hq, d, dtype=torch.float32 if float_out else torch.bfloat16)
    k, v = kv.k, kv.v
    if k.tail.shape[2] != v.tail.shape[2]:
        raise ValueError("K and V tails must have the same capacity")
    args = []
    for p, nbytes in ((k, pool_bytes[0]), (v, pool_bytes[1])):
        args += [_ptr(_check(p.pool, torch.uint8, "pool")), int(nbytes), _ptr(_check(p.table, torch.int64, "table")),
                 p.table.shape[2], _ptr(_check(p.tail, torch.bfloat16, "tail")), _ptr(_check(p.b8p, torch.int32, "b8p")),
                 _ptr(_check(p.dbp, torch.int32, "dbp"))]
    if mask is not None:
        mask = _check(mask, torch.uint8, "mask")
    kv_start = None if kv.kv_start is None else _check(kv.kv_start, torch.int32, "kv_start")
    bad = library().gaac_v3_attention(
        g.block_size, d, b, h, hq // h, sq, _ptr(q), *args, k.tail.shape[2],
        _ptr(_check(kv.num_blocks, torch.int32, "num_blocks")), _ptr(_check(kv.tail_len, torch.int32, "tail_len")),
        _ptr(mask), 0 if mask is None else mask.shape[-1], _ptr(kv_start), float(scale), int(split_tiles), threads(),
        None if float_out else _ptr(out), _ptr(out) if float_out else None)
    if bad:
        raise ValueError(f"corrupt GAAC v3 cache: tile {bad - 1} of a sequence is not a well-formed block inside the pool")
    return out
