"""Run-time compilation and launch of the package's CUDA C++ kernels (NVRTC through ``cuda.core``).

One job: turn a ``.cu`` source of this folder plus ``-D`` parameters into a loaded kernel, cache the
cubin on disk, and launch it on PyTorch's current stream. Nothing here knows what a kernel computes.

- **Compile**: NVRTC via ``cuda.core.Program`` for the device's architecture (``sm_90a`` on Hopper, so
  wgmma/setmaxnreg are available), include path = ``kernels/cuda/include`` only: the sources are
  header-free (no CUDA toolkit headers needed at run time).
- **Cache**: ``$GAAC_CUDA_CACHE`` (default ``~/.cache/gaac_hf/cuda``), one cubin per key; the key hashes
  the source, every header of ``include/``, the defines, the options, the architecture and the NVRTC
  version, so editing a header recompiles. ``GAAC_CUDA_LINEINFO=1`` (profiling only) adds source-line
  tables to the cubin for Nsight Compute's source view; the code is the same.
- **Launch**: on ``torch.cuda.current_stream()`` through ``cuda.core.launch``; tensors pass as their
  data pointers, no host synchronisation, capturable in a CUDA graph. ``GAAC_PDL=1`` (a lab switch, off):
  launchers that support it build with ``GAAC_PDL=1`` and such modules launch with programmatic dependent
  launch (the kernel may start during its predecessor and waits in-kernel; ``include/gaac/ptx.cuh``).

The same source + defines compile with ``nvcc`` on a machine without a GPU (``nvcc_command``): the CPU
checks in ``tests/test_cuda_build.py`` use that to assert resources (registers, no spills) in CI.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import re
import threading
from dataclasses import dataclass, field

import torch

HERE = pathlib.Path(__file__).resolve().parent
INCLUDE = HERE / "include"

try:  # the optional extra: pip install gaac-hf[cuda]
    import cuda.core as _cc
except ImportError as exc:  # pragma: no cover - depends on the environment
    _cc = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class CudaUnavailable(RuntimeError):
    """The CUDA C++ path cannot run here (no cuda.core, no GPU, or an unsupported GPU)."""


def why_unavailable(device: torch.device | None = None) -> str | None:
    """``None`` when the CUDA C++ kernels can run on ``device``; otherwise the reason, in words."""
    if _cc is None:
        return f"cuda.core is not installed (pip install 'gaac-hf[cuda]'): {_IMPORT_ERROR}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(dev)
    if major < 8:
        return f"compute capability {major}.{minor}: the CUDA kernels need sm_80 or newer (mma.sync bf16)"
    return None


def arch_of(device: torch.device) -> str:
    """NVRTC architecture for a device: ``sm_90a`` on Hopper (arch-specific features), else ``sm_XY``."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a" if major == 9 else f"sm_{major}{minor}"


def _headers_digest() -> str:
    """Every header a source of this folder can include (include/ and the sources' own folders)."""
    h = hashlib.sha256()
    for p in sorted(HERE.rglob("*.cuh")):
        h.update(p.relative_to(HERE).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _include_dirs(source: str) -> list[str]:
    """``include/`` plus the source's own folder (its neighbour headers: ``gaac_v3/core.cuh`` from this
    folder, ``core.cuh`` from inside ``gaac_v3/``)."""
    own = (HERE / source).parent
    return [str(INCLUDE), str(own)]


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GAAC_CUDA_CACHE", pathlib.Path.home() / ".cache" / "gaac_hf" / "cuda"))


def _define_flags(defines: dict[str, int | str]) -> list[str]:
    return [f"-D{k}={v}" for k, v in sorted(defines.items())]


def nvcc_command(source: str, defines: dict[str, int | str], arch: str, out: str) -> list[str]:
    """The nvcc line that builds the same cubin as :func:`load` (for CPU-side resource checks)."""
    sm = arch.removeprefix("sm_")
    return ["nvcc", "-cubin", "-std=c++17", f"-gencode=arch=compute_{sm},code=sm_{sm}", "-O3",
            "-Xptxas", "-v", *[f"-I{d}" for d in _include_dirs(source)], *_define_flags(defines),
            str(HERE / source), "-o", out]


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """ptxas ``-v`` report -> {kernel: registers, stack, spill_stores, spill_loads}."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = out.setdefault(m.group(1), {})
        elif cur is not None and (m := _PROPS.search(line)):
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif cur is not None and (m := _REGS.search(line)):
            cur["registers"] = int(m.group(1))
    return out


def resource_problems(report: dict[str, dict[str, int]], max_registers: int) -> list[str]:
    """What is wrong with a build: spills, a stack frame, or registers over the budget (empty: fine)."""
    bad = []
    if not report:
        bad.append("no ptxas report (was -v passed?)")
    for name, r in report.items():
        if r.get("spill_stores", 0) or r.get("spill_loads", 0) or r.get("stack", 0):
            bad.append(f"{name}: local memory (stack {r.get('stack')} B, spills {r.get('spill_stores')}/"
                       f"{r.get('spill_loads')} B)")
        if r.get("registers", 0) > max_registers:
            bad.append(f"{name}: {r['registers']} registers > budget {max_registers}")
    return bad


@dataclass
class Module:
    """A compiled source: its kernels by name, and the ptxas report of the compile."""

    key: str
    objcode: object
    arch: str
    log: str = ""
    pdl: bool = False  # built with GAAC_PDL=1: launched with programmatic stream serialization (see pdl_requested)
    _kernels: dict = field(default_factory=dict)

    def kernel(self, name: str):
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = self.objcode.get_kernel(name)
        return k


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # pragma: no cover - older bindings
        return "unknown"


def compile_cubin(source: str, defines: dict[str, int | str], arch: str) -> tuple[bytes, str, str]:
    """(cubin bytes, ptxas log, cache key) for ``source`` (a file name in this folder); cached on disk."""
    if _cc is None:
        raise CudaUnavailable(why_unavailable())
    text = (HERE / source).read_text()
    opts = dict(arch=arch, std="c++17", include_path=_include_dirs(source), ptxas_options=["-v"])
    if os.environ.get("GAAC_CUDA_LINEINFO") == "1":  # lab profiling: source lines in the cubin (same code)
        opts["lineinfo"] = True
    key = hashlib.sha256("\0".join([
        text, _headers_digest(), repr(sorted(defines.items())), repr(sorted(opts.items())), _nvrtc_version(),
    ]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{source.replace('/', '_').removesuffix('.cu')}-{arch}-{key}.cubin"
    if path.exists():
        log_path = path.with_suffix(".log")
        return path.read_bytes(), log_path.read_text() if log_path.exists() else "", key
    import io

    program = _cc.Program("".join(f"#define {k} {v}\n" for k, v in sorted(defines.items())) + text,
                          code_type="c++", options=_cc.ProgramOptions(**opts))
    log = io.StringIO()
    try:
        obj = program.compile("cubin", logs=log)
    except TypeError:  # cuda.core versions without the logs argument
        obj = program.compile("cubin")
    cubin = bytes(obj.code)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(cubin)
    os.replace(tmp, path)  # atomic: concurrent processes never read a half-written cubin
    path.with_suffix(".log").write_text(log.getvalue())
    return cubin, log.getvalue(), key


@functools.lru_cache(maxsize=None)
def _load_cached(source: str, defines_items: tuple, arch: str, device_index: int) -> Module:
    cubin, log, key = compile_cubin(source, dict(defines_items), arch)
    _cc.Device(device_index).set_current()
    return Module(key=key, objcode=_cc.ObjectCode.from_cubin(cubin), arch=arch, log=log,
                  pdl=_pdl_define(source, dict(defines_items)))


def pdl_requested() -> bool:
    """``GAAC_PDL=1`` in the environment (a lab switch, off by default): the launchers that support it build their
    kernels with ``GAAC_PDL=1`` and launch them with programmatic dependent launch (``include/gaac/ptx.cuh``)."""
    return os.environ.get("GAAC_PDL", "0") == "1"


def _pdl_define(source: str, defines: dict) -> bool:
    """Whether ``defines`` build ``source`` for programmatic dependent launch. A kernel so launched may start
    before the previous kernel ends, so a source that never calls ``pdl_wait`` must not be built with it."""
    if not int(defines.get("GAAC_PDL", 0)):
        return False
    if not _waits(source):
        raise ValueError(f"{source} does not call pdl_wait(): it cannot be launched with GAAC_PDL=1")
    return True


@functools.lru_cache(maxsize=None)
def _waits(source: str) -> bool:
    """Whether ``source`` calls ``pdl_wait()`` (read once per source: load() runs at every launch)."""
    return "pdl_wait()" in (HERE / source).read_text()


def load(source: str, defines: dict[str, int | str], device: torch.device) -> Module:
    """Compile (or take from the caches) ``source`` with ``defines`` for ``device`` and load it."""
    _pdl_define(source, defines)  # refuses GAAC_PDL=1 for a source that does not wait (before any GPU check)
    reason = why_unavailable(device)
    if reason is not None:
        raise CudaUnavailable(reason)
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        return _load_cached(source, tuple(sorted(defines.items())), arch_of(device), index)


class _TorchStream:
    """Adapter: cuda.core accepts any object with ``__cuda_stream__`` -> (version, handle)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_streams: dict = {}


def _stream_for(handle: int, device_index: int):
    """A cuda.core view of a PyTorch stream (made once per stream handle; it does not own it)."""
    s = _streams.get(handle)
    if s is None:
        s = _streams[handle] = _cc.Device(device_index).create_stream(_TorchStream(handle))
    return s


_smem_set: dict = {}


def _set_max_dynamic_smem(kernel, nbytes: int, device_index: int) -> None:
    """Raise the kernel's dynamic shared-memory limit (needed above 48 KB), once per kernel."""
    key = (id(kernel), device_index)
    if _smem_set.get(key, 0) >= nbytes:
        return
    set_kernel_attribute(kernel, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes, device_index)
    _smem_set[key] = nbytes


def set_kernel_attribute(kernel, name: str, value: int, device_index: int) -> None:
    """Set the driver attribute ``CUfunction_attribute.<name>`` of a loaded kernel (library kernels and plain
    functions alike), e.g. its dynamic shared-memory limit or preferred shared-memory carveout."""
    from cuda.bindings import driver

    attr = getattr(driver.CUfunction_attribute, name)
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        _, dev = driver.cuDeviceGet(device_index)
        (err,) = driver.cuKernelSetAttribute(attr, value, handle, dev)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, value)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot set {name} = {value}: {err}")


def _arg(a):
    if isinstance(a, torch.Tensor):
        # a kernel sees only the data pointer: a strided view would be read as if it were dense
        # (a column of a block table once decoded the wrong blocks into a cropped tail)
        if not a.is_contiguous():
            raise ValueError(f"CUDA kernel argument {a.dtype} {tuple(a.shape)} strides {a.stride()} is not "
                             "contiguous: pass .contiguous()")
        return a.data_ptr()
    if a is None:
        return 0  # a null pointer
    return a


def launch(module: Module, name: str, grid: tuple[int, ...], block: tuple[int, ...], smem: int, *args,
           device: torch.device) -> None:
    """Launch kernel ``name`` of ``module`` on PyTorch's current stream of ``device``.

    ``args`` are tensors (passed as device pointers), ``None`` (null pointer) or numpy scalars
    (``np.int32``/``np.float32``: their type fixes the C parameter type).
    """
    import numpy as np  # noqa: F401  (callers pass numpy scalars)

    index = device.index if device.index is not None else torch.cuda.current_device()
    kernel = module.kernel(name)
    if smem > 48 * 1024:
        _set_max_dynamic_smem(kernel, smem, index)
    stream = _stream_for(torch.cuda.current_stream(device).cuda_stream, index)
    if module.pdl:  # its kernels wait for their predecessor in-kernel (pdl_wait): they may launch early
        config = _cc.LaunchConfig(grid=grid, block=block, shmem_size=smem, programmatic_stream_serialization=True)
    else:
        config = _cc.LaunchConfig(grid=grid, block=block, shmem_size=smem)
    _cc.launch(stream, config, kernel, *[_arg(a) for a in args])
