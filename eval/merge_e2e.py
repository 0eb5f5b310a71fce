"""Merge runs of eval/bench_e2e.py into one results file (runs on the CPU, after the GPU runs).

    python eval/merge_e2e.py eval/results/e2e_h200.json RUN1.json RUN2.json ...

Rows keep every key the bench wrote and gain, per row, the ``commit`` and ``command`` of the run they came from
and two plain tables of the step time per cache kind: ``gpu_ms`` and ``wall_ms`` (``static_fa2``,
``static_cudnn``: transformers' StaticCache written in place, SDPA pinned to FA2 / cuDNN, eager; ``gaac``: eager;
``gaac_graph``: CUDA-graph replay). A (batch, context) measured by several runs keeps the later run's row when
that row has a GAAC time and the earlier one does not (a rerun after an out-of-memory); otherwise both stay.
"""
import json
import sys
from pathlib import Path

KINDS = ("static_fa2", "static_cudnn", "static_stock_graph", "fa2", "cudnn", "gaac", "gaac_graph")


def tables(row: dict) -> dict:
    out = {}
    for unit, key in (("gpu_ms", "step_gpu_us_"), ("wall_ms", "step_wall_us_")):
        out[unit] = {k: round(row[key + k] / 1e3, 4) for k in KINDS if row.get(key + k) is not None}
    return out


def merge(out: str, paths: list[str]) -> dict:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict = {}
    for i, run in enumerate(runs):
        for r in run["rows"]:
            key = (r["batch"], r["context"])
            r = dict(r, commit=run["commit"], command=run["command"], part=i, **tables(r))
            old = rows.get(key)
            if old is None or ("gaac" in r["gpu_ms"] and "gaac" not in old["gpu_ms"]):
                rows[key] = r
    first = runs[-1]
    merged = {k: v for k, v in first.items() if k not in ("rows", "command", "commit", "dirty")}
    merged.update(commit=first["commit"], parts=[dict(commit=r["commit"], dirty=r.get("dirty"), command=r["command"],
                                                      provenance_note=r.get("provenance_note")) for r in runs],
                  rows=[rows[k] for k in sorted(rows)])
    Path(out).write_text(json.dumps(merged, indent=1))
    return merged


if __name__ == "__main__":
    m = merge(sys.argv[1], sys.argv[2:])
    for r in m["rows"]:
        print(r["batch"], r["context"], r["gpu_ms"], r["wall_ms"].get("gaac_graph"))
