"""The shared harness of every benchmark and report in ``eval/``: timing, result files with provenance, plots.

Every JSON a script here writes goes through :func:`write_result`, which adds :func:`provenance`:
the git commit of the checkout and whether it had uncommitted changes (``dirty``), the command line,
the versions of python / torch / triton / transformers / gaac-hf, the GPU (or "cpu"), the date, and
whatever the script passes as ``shapes``. ``eval/results/README.md`` lists what each result file is.

Timing helpers (CUDA; each returns microseconds per call):

* :func:`timeit_graph`: n x (L2 flush, fn) captured in one CUDA graph and replayed (no host launch cost);
* :func:`gpu_busy_us`: kernel time summed by the profiler (excludes launch gaps);
* :func:`wall_us`: median wall time with a device sync after each call.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "eval" / "results"


# ---------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------
def git_state(repo: Path = REPO) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout; ``$GAAC_COMMIT`` / ``$GAAC_DIRTY`` (0/1) where the tree was copied
    without its git directory (the GPU machines); (None, None) when neither is known."""
    if os.environ.get("GAAC_COMMIT"):
        dirty = os.environ.get("GAAC_DIRTY")
        return os.environ["GAAC_COMMIT"], (None if dirty is None else dirty not in ("0", "", "false", "False"))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, bool(status.strip())


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers", "gaac_hf"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is reported as absent
            out[name] = None
    return out


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def gpu_tag() -> str:
    """Short card name for result file names: ``h100``, ``h200``, else the device name in lower case
    without spaces (``cpu`` without a GPU). Files say which card measured them; a run on another card
    never overwrites a file named for the card a target was set on."""
    name = gpu_name()
    for tag in ("H100", "H200"):
        if tag in name:
            return tag.lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def provenance(shapes=None, argv: list[str] | None = None) -> dict:
    """What a result file records about how it was made (see the module docstring)."""
    commit, dirty = git_state()
    argv = sys.argv if argv is None else argv
    return {
        "commit": commit,
        "dirty": dirty,
        "command": " ".join(shlex.quote(a) for a in ["python", *argv]),
        "versions": versions(),
        "gpu": gpu_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **({"shapes": shapes} if shapes is not None else {}),
    }


def write_result(path: str | Path, data: dict, shapes=None) -> Path:
    """Write ``data`` as JSON with :func:`provenance` merged in. The script's own keys win, except
    ``commit`` / ``dirty`` (always this checkout's) and ``versions`` (merged: the script may add some)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance(shapes)
    out = prov | data | {"commit": prov["commit"], "dirty": prov["dirty"],
                         "versions": prov["versions"] | (data.get("versions") or {})}
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


_FLUSH: dict = {}


def flush_buffer(dev) -> torch.Tensor:
    """256 MB zeroed before each timed call, like triton's do_bench (the H200's L2 is 50 MB)."""
    if dev not in _FLUSH:
        _FLUSH[dev] = torch.empty(64 * 2**20, dtype=torch.int32, device=dev)
    return _FLUSH[dev]


def timeit_graph(fn, n=10, reps=15):
    """GPU time of one call without host launch overhead: n x (L2 flush, fn) captured in one CUDA graph,
    replayed `reps` times; minus a graph of the n flushes alone; median, divided by n. Launch-bound
    calls (small contexts, Python wrappers) read their kernel time here, their wall time under events."""
    buf = flush_buffer(torch.device("cuda", torch.cuda.current_device()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graphs recommends
        buf.zero_()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = []
    for with_fn in (True, False):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                buf.zero_()
                if with_fn:
                    fn()
        graphs.append(g)
    med = []
    for g in graphs:
        g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        med.append(sorted(ts)[len(ts) // 2])
    del graphs
    return (med[0] - med[1]) / n * 1e3


def kernel_gaps(intervals, steps: int, top: int = 25) -> dict:
    """Idle device time before each kernel, summed by the kernel that ends it: where a step's launch gaps sit.

    intervals: (name, start_us, end_us) of every kernel / copy the profiler saw over ``steps`` calls, any order.
    A gap is the time from the latest end so far to the next start (overlapping kernels leave none). Returns
    ``{"total_us": idle us per call, "busy_us": us per call with at least one kernel running (the union of the
    intervals: kernels that overlap, e.g. under programmatic dependent launch, count once), "after": {name: {"us":
    idle us before it per call, "count": gaps per call}}}``, the ``top`` names with the most idle time first.
    Taken under the profiler, which may itself widen gaps: compare cache kinds and builds measured the same way,
    not the total against an unprofiled wall time."""
    agg: dict = {}
    total, busy, end = 0.0, 0.0, None
    for name, start, stop in sorted(intervals, key=lambda t: (t[1], t[2])):
        if end is not None and start > end:
            us, n = agg.get(name[:160], (0.0, 0))
            agg[name[:160]] = (us + start - end, n + 1)
            total += start - end
        busy += max(0.0, stop - max(start, end if end is not None else start))  # the part not yet covered
        end = stop if end is None else max(end, stop)
    after = sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]
    return {"total_us": round(total / steps, 2), "busy_us": round(busy / steps, 2),
            "after": {k: {"us": round(us / steps, 2), "count": n / steps} for k, (us, n) in after}}


def gpu_busy_us(fn, steps: int = 10, warmup: bool = False, kernels: dict | None = None,
                gaps: dict | None = None) -> float:
    """Sum of CUDA kernel time per call of fn, from the profiler (excludes launch gaps); NaN on the CPU
    (after one call, so smoke runs still exercise fn). With ``kernels`` (a dict), it is filled with
    kernel name -> {"us": device time per call, "calls": launches per call}, longest first: where a
    step's GPU time goes (what two cache kinds' steps spend beyond attention). With ``gaps`` (a dict), it
    is updated with :func:`kernel_gaps` of the profiled calls (the first kernel of each call carries the host's
    time between calls)."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        if warmup:
            fn()
        return float("nan")
    if warmup:
        fn()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    if kernels is not None:
        for e in sorted(events, key=lambda e: -e.self_device_time_total):
            kernels[e.key[:160]] = {"us": round(e.self_device_time_total / steps, 2), "calls": e.count / steps}
    if gaps is not None:
        from torch.autograd import DeviceType

        try:  # never measured on a GPU before session 38's commit: a profiler API change must not cost the run
            gaps.update(kernel_gaps([(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                                     if e.device_type == DeviceType.CUDA], steps))
        except (AttributeError, TypeError) as err:
            gaps["error"] = repr(err)
    return sum(e.self_device_time_total for e in events) / steps


def span_us(fn, steps: int) -> float:
    """Median device span per call of fn (CUDA events around each call, nothing else queued): kernel
    time plus the gaps between its kernels, which :func:`gpu_busy_us` leaves out. NaN on the CPU."""
    if not torch.cuda.is_available():
        return float("nan")
    sync()
    t = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b) * 1e3)
    t.sort()
    return t[len(t) // 2]


def wall_us(fn, steps: int) -> float:
    """Median wall time per call, the device synchronized before and after each call."""
    sync()
    t = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        sync()
        t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2] * 1e6


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (no display on the benchmark machines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# -- the decode-attention grid (eval/bench_attention_bf16.py, eval/bench_attention_v3.py) ------------
#: (query heads, kv heads, head_dim) of the grid's model shapes
ATTENTION_SHAPES = {"qwen3-8b": (32, 8, 128), "smollm2-135m": (9, 3, 64), "gemma3": (4, 1, 256)}
#: shapes that run the same numbers as another (reported as aliases)
SAME_SHAPE = {"llama-3.1-8b": "qwen3-8b"}
ATTENTION_CONTEXTS = [4096, 16384, 32768, 65536, 131072]
ATTENTION_BATCHES = [1, 4, 16]


def sdpa_decode(backend: str, q, k, v):
    """A callable running SDPA pinned to ``backend`` ("fa2" or "cudnn") for decode queries
    ``q`` bf16 ``[B, Hq, D]`` over dense ``k`` / ``v`` ``[B, Hkv, S, D]`` (GQA)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    q4 = q.unsqueeze(2)

    def f():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

    return f


def time_and_error(name: str, make, ref=None):
    """(GPU us of ``make()``'s callable by :func:`timeit_graph`, its relative error against ``ref``), or
    (None, None) when the backend refuses the shape (printed, not fatal)."""
    import torch

    try:
        f = make()
        o = f()
        torch.cuda.synchronize()
        err = None
        if ref is not None and o is not None:
            o = o.reshape(ref.shape)
            err = float((o.float() - ref.float()).norm() / ref.float().norm())
        return timeit_graph(f), err
    except Exception as e:  # a backend refusing a shape is recorded, not fatal
        print(f"  {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None, None
