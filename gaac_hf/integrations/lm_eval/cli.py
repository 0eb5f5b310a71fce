"""``gaac-lm-eval``: lm-eval's own command line with the ``hf-gaac`` model registered.

lm-eval 0.4.13 has no plugin discovery for model classes, so this wrapper imports
:mod:`gaac_hf.integrations.lm_eval.model` (which registers ``hf-gaac``) and hands over to
``lm_eval.__main__.cli_evaluate()``; every lm-eval option works unchanged. It defaults the Hugging Face
libraries to offline mode (set ``HF_HUB_OFFLINE=0`` / ``HF_DATASETS_OFFLINE=0`` to go online) and,
when ``--include_path`` is not given, adds the shipped task folder (package data), so ``gaac_piqa`` and
the other offline tasks are found from any directory.
"""
from __future__ import annotations

import os
import sys

from . import tasks_dir

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def main(argv: list[str] | None = None) -> None:
    for var in OFFLINE_VARS:
        os.environ.setdefault(var, "1")
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    args = sys.argv[1:]
    if args and args[0] not in ("-h", "--help", "ls", "validate") and "--include_path" not in args:
        sys.argv += ["--include_path", str(tasks_dir())]

    from lm_eval.__main__ import cli_evaluate

    from . import model  # noqa: F401  (registers hf-gaac)

    cli_evaluate()


if __name__ == "__main__":
    main()
