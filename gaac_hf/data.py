"""Where real text comes from (calibration, tests, the lm-eval tasks, eval tools), in a stated order.

Public data sets are never copied into the repository. A data file ``rel`` (e.g.
``"wikitext-2-raw-v1/wiki.test.raw"``) is looked for, in this order:

1. ``$GAAC_HF_DATA/<rel>`` when the environment variable ``GAAC_HF_DATA`` is set (a folder holding
   ``wikitext-2-raw-v1/``, ``wikitext-2-v1/``, ``piqa/``, ``gsm8k/``, ``humaneval/``);
2. ``../shared/data/<rel>`` beside the source checkout this package runs from;
3. for WikiText only (:func:`wikitext`), the Hugging Face ``datasets`` cache (``Salesforce/wikitext``;
   a user who is online fills it with the first call).

When none has it, :class:`DataNotFound` says where it looked, in one line (tests skip with it).
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "GAAC_HF_DATA"
CHECKOUT = Path(__file__).resolve().parents[1]

#: the WikiText-2 files of the shared data folder, and their ``datasets`` config / split
WIKITEXT_FILES = {
    ("test", True): ("wikitext-2-raw-v1/wiki.test.raw", "wikitext-2-raw-v1", "test"),
    ("validation", False): ("wikitext-2-v1/valid.txt", "wikitext-2-v1", "validation"),
}


class DataNotFound(FileNotFoundError):
    """No source in the stated order holds the data."""


def data_dirs() -> list[Path]:
    """The folders searched, in order: ``$GAAC_HF_DATA`` (if set), then ``../shared/data`` beside the checkout."""
    env = os.environ.get(ENV)
    dirs = [Path(env).expanduser()] if env else []
    return dirs + [CHECKOUT.parent / "shared" / "data"]


def data_file(rel: str) -> Path:
    """The first ``<dir>/<rel>`` that exists among :func:`data_dirs`, else :class:`DataNotFound`."""
    tried = [d / rel for d in data_dirs()]
    for p in tried:
        if p.is_file():
            return p
    raise DataNotFound(f"data file {rel} not found (looked in {', '.join(map(str, tried))}); "
                       f"set {ENV} to a folder holding it")


def wikitext(split: str = "test", raw: bool = True) -> tuple[str, str]:
    """(text, where it came from) of WikiText-2: the test split of the raw version (held-out
    evaluation) or the validation split of the tokenized version (calibration)."""
    if (split, raw) not in WIKITEXT_FILES:
        raise ValueError(f"no WikiText-2 source for split={split!r}, raw={raw}")
    rel, config, ds_split = WIKITEXT_FILES[split, raw]
    try:
        p = data_file(rel)
        return p.read_text(encoding="utf-8"), str(p)
    except DataNotFound as e:
        first = str(e)
    try:
        import datasets

        ds = datasets.load_dataset("Salesforce/wikitext", config, split=ds_split)
    except Exception as e:  # noqa: BLE001 - not installed, offline with an empty cache, ...
        raise DataNotFound(f"{first}; the datasets cache has no Salesforce/wikitext {config} either "
                           f"({type(e).__name__})") from None
    return "".join(ds["text"]), f"datasets:Salesforce/wikitext/{config}/{ds_split}"
