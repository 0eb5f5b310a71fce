"""The calibration tables shipped as package data, found by name from any directory.

``find_table("smollm2-135m")`` (or ``"smollm2-135m.safetensors"``) returns the installed file;
anything that names an existing file is returned as that path; the old repository-relative
spelling ``"calibration_data/smollm2-135m.safetensors"`` still finds the shipped table from any
directory. An unknown name raises FileNotFoundError listing the shipped names.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

SUFFIX = ".safetensors"


def shipped_dir() -> Path:
    """The folder of the shipped tables (``calibration_data/`` of the checkout or of the wheel)."""
    return Path(str(resources.files("gaac_hf.calibration_data")))


def shipped_tables() -> dict[str, Path]:
    """Shipped table name (file name without ``.safetensors``) -> its path, sorted by name."""
    return {p.name[: -len(SUFFIX)]: p for p in sorted(shipped_dir().glob("*" + SUFFIX))}


def find_table(spec: str | Path) -> Path:
    """Path of a calibration table given a path or a shipped name (see the module docstring)."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    name = p.name[: -len(SUFFIX)] if p.name.endswith(SUFFIX) else p.name
    shipped = shipped_tables()
    # a bare name, or <something>/calibration_data/<name>.safetensors from a checkout's README
    if name in shipped and (len(p.parts) == 1 or p.parent.name == "calibration_data"):
        return shipped[name]
    names = ", ".join(repr(n) for n in shipped) or "none"
    raise FileNotFoundError(f"no calibration table at {str(spec)!r} (not a file, not a shipped name; shipped: {names})")
