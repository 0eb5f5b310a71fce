"""Build of the g++ test driver of the v3 cores (kernels/cuda/gaac_v3/host_driver.cpp: core.cuh, core_fp8.cuh
and their block walks), optionally with one file's text replaced (the mutation checks)."""
import shutil
import subprocess
from pathlib import Path

CORE_DIR = Path(__file__).resolve().parents[1] / "kernels" / "cuda" / "gaac_v3"
SOURCES = ("core.cuh", "core_fp8.cuh", "host_block.h", "host_block_fp8.h", "host_driver.cpp")


def build(dest: Path, replace: dict[str, str] | None = None) -> Path:
    src = dest / "src"
    src.mkdir(parents=True, exist_ok=True)
    for f in SOURCES:
        shutil.copy(CORE_DIR / f, src / f)
    for f, text in (replace or {}).items():
        (src / f).write_text(text)
    exe = dest / "host_driver"
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", str(exe), str(src / "host_driver.cpp")], check=True, capture_output=True)
    return exe
