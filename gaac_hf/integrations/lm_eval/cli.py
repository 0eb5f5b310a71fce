"""``gaac-lm-eval``: lm-eval's own command line with the ``hf-gaac`` model registered.

lm-eval 0.4.13 has no plugin discovery for model classes, so this wrapper imports
:mod:`gaac_hf.integrations.lm_eval.model` (which registers ``hf-gaac``) and hands over to
``lm_eval.__main__.cli_evaluate()``; every lm-eval option works unchanged. It defaults the Hugging Face
libraries to offline mode (set ``HF_HUB_OFFLINE=0`` / ``HF_DATASETS_OFFLINE=0`` to go online) and,
when ``--include_path`` is not given, adds the shipped task folder (package data), so ``gaac_piqa`` and
the other offline tasks are found from any directory. When every ``--tasks`` name is a shipped task,
lm-eval's own task index is not built (``include_defaults=False``: 15 s or more saved at start).
"""
from __future__ import annotations

import os
import sys

from . import only_shipped, tasks_dir

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def main(argv: list[str] | None = None) -> None:
    for var in OFFLINE_VARS:
        os.environ.setdefault(var, "1")
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    args = sys.argv[1:]
    if args and args[0] not in ("-h", "--help", "ls", "validate") and "--include_path" not in args:
        sys.argv += ["--include_path", str(tasks_dir())]
        tasks = _option(args, "--tasks")
        if tasks and only_shipped(t.strip() for t in tasks.split(",") if t.strip()):
            _without_lm_eval_index()

    from lm_eval.__main__ import cli_evaluate

    from . import model  # noqa: F401  (registers hf-gaac)

    cli_evaluate()


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``args`` (the last one given), else None."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _without_lm_eval_index() -> None:
    """lm-eval's CLI builds ``lm_eval.tasks.TaskManager(include_path=..., metadata=...)``; give it one
    that leaves lm-eval's own tasks out unless asked (only the shipped tasks were requested)."""
    import lm_eval.tasks

    class ShippedTaskManager(lm_eval.tasks.TaskManager):
        def __init__(self, *args, include_defaults: bool = False, **kwargs):
            super().__init__(*args, include_defaults=include_defaults, **kwargs)

    lm_eval.tasks.TaskManager = ShippedTaskManager


if __name__ == "__main__":
    main()
