"""lm-evaluation-harness integration: the ``hf-gaac`` model (:mod:`.model`), the ``gaac-lm-eval``
command (:mod:`.cli`) and the offline tasks shipped as package data (``tasks/``).

Importing this package does not import lm-eval; importing :mod:`.model` does, and registers ``hf-gaac``.
"""
from pathlib import Path

#: the shipped task folder (YAML + ``gaac_tasks.py``), for lm-eval's ``--include_path``
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def tasks_dir() -> Path:
    return TASKS_DIR
