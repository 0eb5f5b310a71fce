#!/usr/bin/env python
"""Quality parity: the same lm-eval tasks with a BF16 DynamicCache and with a GAAC cache, sample by sample.

Both runs use :class:`gaac_hf.integrations.lm_eval.model.GAACLM` with the same chunked prefill (``prefill_chunk``
tokens per forward, later chunks attending over cached history), so the only difference is the cache:
``gaac=false`` (DynamicCache + sdpa) versus ``gaac=true`` (GAACCache + the registered ``gaac``
attention). GAAC is lossless, so every per-sample output must be identical: generated strings
character for character and loglikelihoods as floats compared with ``==``. Any difference makes the
script exit with status 1.

With ``--chunking-baseline`` a third run (``gaac=false, chunked=false``: plain HFLM, one forward per
request) is compared against the chunked BF16 run for loglikelihood tasks and reported, not enforced:
it quantifies what chunked prefill itself changes (different matmul shapes round differently in BF16).

Writes ``eval/results/parity_<model>.json``::

    python eval/parity.py --model smollm2 --calibration calibration_data/smollm2-135m.safetensors \\
        --limit 100 --chunking-baseline

FP8 (``--kv-dtype fp8_e4m3`` or ``fp8_e5m2``, ``--calibration`` an FP8 table): the baseline is the FP8 cache
without GAAC (``FP8DynamicCache``, same scales, chunked prefill), compared with ``GAACCache(kv_dtype=...)``;
per-task keys say ``fp8`` where a BF16 run says ``bf16``. Writes ``eval/results/parity_fp8_<model>.json``::

    python eval/parity.py --model smollm2 --kv-dtype fp8_e4m3 --calibration smollm2-135m-fp8_e4m3 --limit 50
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from gaac_hf.integrations.lm_eval import task_manager  # noqa: E402  (the shipped tasks, package data)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402
DEFAULT_TASKS = ("gaac_piqa", "gaac_gsm8k", "gaac_humaneval", "gaac_wikitext")
PRIMARY_METRIC = {
    "gaac_piqa": "acc",
    "gaac_gsm8k": "exact_match",
    "gaac_humaneval": "parses",
    "gaac_wikitext": "word_perplexity",
}
LOGLIKELIHOOD_TYPES = ("loglikelihood", "multiple_choice", "loglikelihood_rolling")


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------
def _floats(x):
    if isinstance(x, bool):
        return
    if isinstance(x, float):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _floats(y)


def same(a, b) -> bool:
    """Exact structural equality; floats with ``==`` (two NaNs count as equal), strings char for char."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def max_abs_diff(a, b) -> float:
    fa, fb = list(_floats(a)), list(_floats(b))
    if len(fa) != len(fb) or not fa:
        return 0.0
    return max(abs(x - y) for x, y in zip(fa, fb))


def _by_doc(samples: list[dict]) -> dict:
    return {int(s["doc_id"]): s for s in samples}


def compare_samples(ref: list[dict], new: list[dict]) -> dict:
    """Per-sample comparison of two lm-eval ``samples`` lists (raw ``resps`` and ``filtered_resps``)."""
    a, b = _by_doc(ref), _by_doc(new)
    if a.keys() != b.keys():
        return {"n": len(a), "identical": False, "n_different": len(a.keys() ^ b.keys()),
                "different_doc_ids": sorted(a.keys() ^ b.keys())[:20], "max_abs_diff": float("nan")}
    diff, worst, prompts_differ = [], 0.0, []
    for d in sorted(a):
        ra, rb = a[d]["resps"], b[d]["resps"]
        if not (same(ra, rb) and same(a[d]["filtered_resps"], b[d]["filtered_resps"])):
            diff.append(d)
        if _args(a[d]) != _args(b[d]):  # both runs must have been asked the same thing
            prompts_differ.append(d)
        worst = max(worst, max_abs_diff(ra, rb))
    return {"n": len(a), "identical": not diff and not prompts_differ, "n_different": len(diff),
            "different_doc_ids": diff[:20], "prompts_differ": prompts_differ[:20], "max_abs_diff": worst}


def _args(sample: dict):
    return json.dumps(sample.get("arguments"), sort_keys=True, default=str)


def _metrics(task_result: dict) -> dict:
    out = {}
    for k, v in task_result.items():
        if "," not in k or "_stderr" in k:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k.split(",")[0]] = float(v)
    return out


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _without_env_info():
    """``simple_evaluate`` ends with lm-eval's ``add_env_info`` (torch's environment report: ``pip list``
    and more in subprocesses, 1-2 s a call). This script keeps only the results and samples and records
    its own versions (``_versions``), so that report is skipped while it runs."""
    import lm_eval.evaluator as ev

    orig = getattr(ev, "add_env_info", None)
    if orig is not None:
        ev.add_env_info = lambda results: None
    try:
        yield
    finally:
        if orig is not None:
            ev.add_env_info = orig


def _run_task(lm, task: str, limit: int | None, tm, gen_kwargs: str | None,
              docs: list[int] | None = None) -> tuple[dict, list, float]:
    import lm_eval

    t0 = time.time()
    # lm-eval takes either a limit or the documents by index (``samples``), not both
    pick = dict(samples={task: docs}) if docs else dict(limit=limit)
    with _without_env_info():
        res = lm_eval.simple_evaluate(
            model=lm, tasks=[task], task_manager=tm, log_samples=True,
            bootstrap_iters=0, gen_kwargs=gen_kwargs, verbosity="WARNING", **pick,
        )
    res["results"][task]["output_type"] = res["configs"][task]["output_type"]
    return res["results"][task], res["samples"][task], time.time() - t0


def parse_task_limits(items: list[str]) -> dict[str, int]:
    out = {}
    for it in items or []:
        name, _, n = it.partition("=")
        if not n:
            raise SystemExit(f"--task-limit wants NAME=N, got {it!r}")
        out[name.strip()] = int(n)
    return out


def parse_task_docs(items: list[str]) -> dict[str, list[int]]:
    """``TASK=i,j`` -> {TASK: [i, j]}: documents of a task picked by index (instead of its first --limit)."""
    out = {}
    for it in items or []:
        name, _, ids = it.partition("=")
        try:
            out[name.strip()] = [int(x) for x in ids.split(",") if x.strip()]
        except ValueError:
            raise SystemExit(f"--task-docs wants NAME=i,j,..., got {it!r}") from None
        if not out[name.strip()]:
            raise SystemExit(f"--task-docs wants NAME=i,j,..., got {it!r}")
    return out


def merge(paths: list[str], out: Path) -> int:
    """Combine parity JSONs of separate runs (e.g. task subsets run in parallel) into one report."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    models = {r["model"] for r in parts}
    if len(models) != 1:
        raise SystemExit(f"cannot merge parity runs of different models: {sorted(models)}")
    tasks = {}
    for r in parts:
        for name, t in r["tasks"].items():
            if name in tasks:
                raise SystemExit(f"task {name!r} is in more than one run (use --tag for a second run)")
            tasks[name] = dict(t, settings=r.get("settings"), command=r["command"])
    per_task = {name: t.get("limit") for name, t in tasks.items()}
    limits = set(per_task.values())
    report = {
        "model": parts[0]["model"],
        "tasks": tasks,
        "all_identical": all(r["all_identical"] for r in parts) and all(t["identical"] for t in tasks.values()),
        "limit": limits.pop() if len(limits) == 1 else per_task,  # documents per task
        "task_limits": {k: v for r in parts for k, v in r.get("task_limits", {}).items()},
        "command": " ; ".join(r["command"] for r in parts),
        "complete": all(r.get("complete", False) for r in parts),
        "settings": {k: v for k, v in (parts[0].get("settings") or {}).items()  # shared by all runs; per task too
                     if all((r.get("settings") or {}).get(k) == v for r in parts)},
        "versions": parts[0].get("versions"),
        "seconds_total": max(r.get("seconds_total", 0) for r in parts),
        "merged_from": [_rel(p) for p in paths],
    }
    formats = {f for t in tasks.values() for f in (t.get("gaac_cache") or {}).get("format_versions", [])}
    if formats:
        report["format_versions"] = sorted(formats)  # what the GAAC caches of every merged task used
    out.parent.mkdir(parents=True, exist_ok=True)
    harness.write_result(out, report)
    print(f"[parity] merged {len(parts)} runs into {out}; all_identical={report['all_identical']}")
    return 0 if report["all_identical"] and report["complete"] else 1


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--merge"]:
        mp = argparse.ArgumentParser(description="merge parity JSONs")
        mp.add_argument("--merge", nargs="+", required=True)
        mp.add_argument("--out", required=True)
        a = mp.parse_args(argv)
        return merge(a.merge, Path(a.out))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' or a local transformers folder (BF16)")
    p.add_argument("--calibration", default=str(REPO / "calibration_data" / "smollm2-135m.safetensors"))
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    p.add_argument("--limit", type=int, default=100, help="documents per task (0 = all)")
    p.add_argument("--task-limit", action="append", default=[], metavar="TASK=N", help="per-task override of --limit")
    p.add_argument("--task-docs", action="append", default=[], metavar="TASK=i,j",
                   help="run these documents of a task (by index) instead of its first --limit ones")
    p.add_argument("--max_length", type=int, default=2048, help="model context for lm-eval (rolling windows, truncation)")
    p.add_argument("--block_size", type=int, default=None)
    p.add_argument("--prefill_chunk", type=int, default=None, help="tokens per prefill forward (default 4 blocks)")
    p.add_argument("--max_gen_toks", type=int, default=None, help="override the tasks' max_gen_toks (short CI runs)")
    p.add_argument("--chunking-baseline", action="store_true", help="also compare chunked vs unchunked BF16 (reported)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default); 1 is much faster on a shared, oversubscribed CPU")
    p.add_argument("--out", default=None, help="JSON path (default eval/results/parity_<model>.json)")
    p.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp8_e4m3", "fp8_e5m2"),
                   help="the cache's K/V dtype; FP8 compares FP8DynamicCache with an FP8 GAACCache (FP8 table needed)")
    p.add_argument("--tag", default=None, help="report tasks as '<task>@<tag>' (a second run of a task with other settings)")
    args = p.parse_args(argv)

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from gaac_hf.integrations.lm_eval.model import GAACLM

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    task_limits = parse_task_limits(args.task_limit)
    task_docs = parse_task_docs(args.task_docs)
    model_tag = Path(args.model).name.lower() if Path(args.model).is_dir() else args.model.lower()
    fp8 = args.kv_dtype != "bf16"
    base = "fp8" if fp8 else "bf16"  # the baseline's name in the report's keys
    out = Path(args.out) if args.out else REPO / "eval" / "results" / f"parity_{'fp8_' if fp8 else ''}{model_tag}.json"
    gen_kwargs = f"max_gen_toks={args.max_gen_toks}" if args.max_gen_toks else None

    common = dict(pretrained=args.model, max_length=args.max_length, device=args.device, batch_size=1,
                  softmax_dtype="float32", block_size=args.block_size, prefill_chunk=args.prefill_chunk,
                  kv_dtype=args.kv_dtype)
    # fused=False: GAAC's reference attention (decode + the stock SDPA) also on CUDA, where the fused
    # decode kernel would otherwise run for q_len == 1 (equal to SDPA only within bf16 tolerance).
    tm = task_manager(tasks)  # lm-eval's own task index only if a task is not shipped
    t0 = time.time()
    bf16 = GAACLM(gaac=False, **common, **({"calibration": args.calibration} if fp8 else {}))
    gaac = GAACLM(gaac=True, calibration=args.calibration, fused=False, **common)
    if args.chunking_baseline and fp8:
        raise SystemExit("--chunking-baseline compares BF16 runs; leave it out with --kv-dtype")
    plain = GAACLM(gaac=False, chunked=False, **common) if args.chunking_baseline else None

    report_tasks, all_identical = {}, True

    def report(complete: bool) -> dict:
        r = {
            "model": args.model,
            "tasks": report_tasks,
            "all_identical": all_identical,
            "limit": (args.limit or None) if not task_limits else {t: task_limits.get(t, args.limit) or None for t in tasks},
            "task_limits": task_limits,
            "task_docs": task_docs,
            "command": "python eval/parity.py " + " ".join(shlex.quote(a) for a in argv),
            "complete": complete,
            "settings": {"max_length": args.max_length, "prefill_chunk": gaac.prefill_chunk,
                         "block_size": args.block_size or gaac._calibration.geometry.block_size,
                         "calibration": _rel(args.calibration), "softmax_dtype": "float32", "batch_size": 1,
                         "max_gen_toks": args.max_gen_toks, "device": args.device, "threads": args.threads or None,
                         "kv_dtype": args.kv_dtype,
                         base: ("gaac=false: DynamicCache + sdpa, chunked prefill" if not fp8 else
                                f"gaac=false: FP8DynamicCache ({args.kv_dtype}, the table's static scales) + sdpa, chunked prefill"),
                         "gaac": ("gaac=true: GAACCache + gaac attention (reference path), chunked prefill" if not fp8 else
                                  f"gaac=true: GAACCache(kv_dtype={args.kv_dtype}) + gaac attention (reads the dequantized "
                                  "cache: SDPA), chunked prefill")},
            "versions": _versions(),
            "seconds_total": round(time.time() - t0, 1),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        harness.write_result(out, r)
        return r

    for task in tasks:
        limit = task_limits.get(task, args.limit) or None
        r_bf, s_bf, sec_bf = _run_task(bf16, task, limit, tm, gen_kwargs, task_docs.get(task))
        otype = r_bf["output_type"]
        calls0 = gaac.gaac_calls
        stats0 = len(gaac.gaac_stats)
        r_ga, s_ga, sec_ga = _run_task(gaac, task, limit, tm, gen_kwargs, task_docs.get(task))
        cmp = compare_samples(s_bf, s_ga)
        m_bf, m_ga = _metrics(r_bf), _metrics(r_ga)
        scores_equal = same(m_bf, m_ga) if set(m_bf) == set(m_ga) else False
        identical = cmp["identical"] and scores_equal
        metric = PRIMARY_METRIC.get(task) or (sorted(m_bf)[0] if m_bf else None)
        entry = {
            "n": cmp["n"],
            "identical": identical,
            f"score_{base}": m_bf.get(metric),
            "score_gaac": m_ga.get(metric),
            "metric": metric,
            "output_type": otype,
            "limit": limit,
            "n_different": cmp["n_different"],
            "different_doc_ids": cmp["different_doc_ids"],
            "max_abs_diff": cmp["max_abs_diff"],
            f"metrics_{base}": m_bf,
            "metrics_gaac": m_ga,
            f"seconds_{base}": round(sec_bf, 1),
            "seconds_gaac": round(sec_ga, 1),
            "gaac_cache_calls": gaac.gaac_calls - calls0,
        }
        entry["gaac_cache"] = summarize_stats(gaac.gaac_stats[stats0:])
        if plain is not None and otype in LOGLIKELIHOOD_TYPES:
            r_pl, s_pl, sec_pl = _run_task(plain, task, limit, tm, gen_kwargs)
            c2 = compare_samples(s_pl, s_bf)
            entry["chunking"] = {
                "compared": "bf16 one forward per request (plain HFLM) vs bf16 chunked prefill",
                "identical": c2["identical"], "n_different": c2["n_different"], "max_abs_diff": c2["max_abs_diff"],
                "score_unchunked": _metrics(r_pl).get(metric), "seconds": round(sec_pl, 1),
            }
        report_tasks[f"{task}@{args.tag}" if args.tag else task] = entry
        all_identical &= identical
        report(complete=False)  # partial results survive an interrupted long run
        flag = "IDENTICAL" if identical else f"DIFFERENT ({cmp['n_different']} samples, max |d| {cmp['max_abs_diff']:.3g})"
        print(f"[parity] {task}: n={cmp['n']} {metric} {base}={entry[f'score_{base}']} gaac={entry['score_gaac']} {flag} "
              f"({sec_bf:.0f}s / {sec_ga:.0f}s)", flush=True)

    report(complete=True)
    print(f"[parity] wrote {out}; all_identical={all_identical}", flush=True)
    if not all_identical:
        print(f"[parity] FAIL: {base.upper()} and GAAC outputs differ", file=sys.stderr)
        return 1
    return 0


def summarize_stats(stats: list[dict]) -> dict:
    """What the GAAC caches of one task held at the end of each call, summed over calls."""
    keys = ("encoded_blocks", "stored_blocks", "raw_fallback_blocks", "resident_bytes", "bf16_bytes", "fp8_bytes", "seq_length")
    tot = {k: int(sum(s.get(k, 0) for s in stats)) for k in keys}
    if not tot["fp8_bytes"]:
        del tot["fp8_bytes"]
    else:
        tot["ratio_vs_fp8"] = tot["fp8_bytes"] / tot["resident_bytes"] if tot["resident_bytes"] else None
    tot["calls"] = len(stats)
    tot["calls_with_encoded_blocks"] = sum(1 for s in stats if s.get("encoded_blocks", 0) > 0)
    tot["ratio"] = tot["bf16_bytes"] / tot["resident_bytes"] if tot["resident_bytes"] else None
    # the storage format(s) the caches used (cache.stats()["format_version"])
    tot["format_versions"] = sorted({s["format_version"] for s in stats if s.get("format_version") is not None})
    return tot


def _rel(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _jsonable(x):
    try:
        return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    except (TypeError, ValueError):
        return str(x)


def _versions() -> dict:
    import lm_eval
    import torch
    import transformers

    import gaac_hf

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "lm_eval": getattr(lm_eval, "__version__", "?"), "gaac_hf": gaac_hf.__version__}


if __name__ == "__main__":
    sys.exit(main())
