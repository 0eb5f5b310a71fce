"""First-call cost of the CPU library: a cold build of kernels/cpu/gaac_cpu.cpp (empty cache folder), then
a warm load (the cached .so), both timed in fresh processes (after importing torch).

    python eval/cpu_build_time.py      # -> eval/results/cpu_build.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

PROBE = ("import time, torch; from gaac_hf.kernels.cpu import native; t = time.perf_counter(); ok = native.available(); "
         "print('RESULT', ok, time.perf_counter() - t)")


def run(cache_dir: str) -> tuple[bool, float]:
    env = dict(os.environ, GAAC_HF_CACHE=cache_dir)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True).stdout
    _, ok, sec = out.split()[-3:]
    return ok == "True", float(sec)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        cold = run(d)
        warm = run(d)
    compiler = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    res = {"cold_build_s": cold[1], "warm_load_s": warm[1], "built": cold[0] and warm[0], "compiler": compiler,
           "cpu_count": os.cpu_count(), "loadavg_1min": os.getloadavg()[0]}
    print(json.dumps(res))
    harness.write_result(Path(__file__).resolve().parent / "results" / "cpu_build.json", res)


if __name__ == "__main__":
    main()
