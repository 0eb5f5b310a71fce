"""Data loading and scoring for the offline gaac-hf tasks (shipped as package data; ``gaac-lm-eval``
adds this folder to lm-eval's ``--include_path``).

The data is never copied into the repository: every loader reads it from the shared data folder
found by :mod:`gaac_hf.data` (``$GAAC_HF_DATA`` if set, else ``../shared/data`` beside the
checkout), so the tasks work from any working directory and in a fresh clone that has ``../shared``
beside it. Loaders are used through ``custom_dataset: !function gaac_tasks.<name>``;
lm-eval calls them with the task's metadata as keyword arguments, which they ignore.
"""
from __future__ import annotations

import ast
import gzip
import json
import re
from pathlib import Path

import datasets

from gaac_hf.data import data_file

WIKITEXT = "wikitext-2-raw-v1/wiki.test.raw"
PIQA = ("piqa/valid.jsonl", "piqa/valid-labels.lst")
GSM8K = "gsm8k/test.jsonl"
HUMANEVAL = "humaneval/HumanEval.jsonl.gz"


def _file(rel: str) -> Path:
    return data_file(rel)


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _split(rows: list[dict]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


# ---------------------------------------------------------------------------------------------
# loaders (custom_dataset)
# ---------------------------------------------------------------------------------------------
def load_piqa(**_) -> datasets.DatasetDict:
    """PIQA validation (1,838 items): goal, sol1, sol2 and the integer label from valid-labels.lst."""
    items = _read_jsonl(_file(PIQA[0]))
    labels = [int(x) for x in _file(PIQA[1]).read_text().split()]
    if len(items) != len(labels):
        raise ValueError(f"PIQA: {len(items)} items but {len(labels)} labels")
    return _split([{"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": y} for d, y in zip(items, labels)])


def load_gsm8k(**_) -> datasets.DatasetDict:
    """GSM8K test (1,319 problems): question, answer (worked solution ending in ``#### N``), target N."""
    rows = _read_jsonl(_file(GSM8K))
    return _split([{"question": d["question"], "answer": d["answer"], "target": gsm8k_gold(d["answer"])} for d in rows])


def load_humaneval(**_) -> datasets.DatasetDict:
    """HumanEval (164 problems): task_id, prompt, canonical_solution, entry_point (tests are not run)."""
    rows = _read_jsonl(_file(HUMANEVAL))
    keep = ("task_id", "prompt", "canonical_solution", "entry_point")
    return _split([{k: d[k] for k in keep} for d in rows])


_TITLE = re.compile(r"^ = [^=].* = $")


def wikitext_documents(text: str) -> list[dict]:
    """Split WikiText raw text into articles at the top-level `` = Title = `` lines."""
    docs, cur, title = [], [], None
    for line in text.replace("\r\n", "\n").split("\n"):
        if _TITLE.match(line):
            if title is not None:
                docs.append({"title": title, "page": "\n".join(cur).strip("\n") + "\n"})
            title, cur = line.strip(" =").strip(), [line]
        elif title is not None:
            cur.append(line)
    if title is not None:
        docs.append({"title": title, "page": "\n".join(cur).strip("\n") + "\n"})
    return docs


def load_wikitext(**_) -> datasets.DatasetDict:
    """WikiText-2 raw test split as 62 documents (one per article)."""
    return _split(wikitext_documents(_file(WIKITEXT).read_text(encoding="utf-8")))


# ---------------------------------------------------------------------------------------------
# prompts and scoring
# ---------------------------------------------------------------------------------------------
_WT_JOINS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def wikitext_text(doc: dict) -> str:
    """The article with WikiText's `` @-@ `` style number/hyphen escapes undone."""
    page = doc["page"]
    for a, b in _WT_JOINS:
        page = page.replace(a, b)
    return page


_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _norm_number(s: str) -> str:
    s = s.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        v = float(s)
    except ValueError:
        return s
    return str(int(v)) if v == int(v) else repr(v)


def gsm8k_gold(answer: str) -> str:
    return _norm_number(answer.split("####")[-1])


def gsm8k_score(doc: dict, results: list[str]) -> dict:
    """exact_match: the last number in the generation equals the gold answer."""
    nums = _NUM.findall(results[0])
    pred = _norm_number(nums[-1]) if nums else ""
    return {"exact_match": float(pred == doc["target"])}


def humaneval_score(doc: dict, results: list[str]) -> dict:
    """exact_match with the canonical solution (whitespace-trimmed) and whether prompt+completion parses.

    The tests are not executed: these runs compare BF16 and GAAC generations, not pass@1.
    """
    out = results[0]
    em = float(out.strip() == doc["canonical_solution"].strip())
    try:
        ast.parse(doc["prompt"] + out)
        parses = 1.0
    except (SyntaxError, ValueError):
        parses = 0.0
    return {"exact_match": em, "parses": parses}
