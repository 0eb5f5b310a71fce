"""eval/bench_e2e.py's prefill chunking rule (CPU, no model): a batch whose prompt tokens or whose
masked chunk would not fit is prefilled in chunks that keep both bounded."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EVAL = Path(__file__).resolve().parents[1] / "eval"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_e2e", EVAL / "bench_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("B,S", [(1, 8192), (1, 131072), (4, 65536), (4, 131072), (16, 32768), (16, 65536), (3, 100000)])
def test_prefill_chunk_bounds_tokens_and_mask(bench, B, S):
    chunk = bench.prefill_chunk(B, S)
    if B * S <= bench.PREFILL_TOKENS:
        assert chunk == S  # one forward, no mask (causal)
        return
    assert chunk % 64 == 0 and 64 <= chunk < S
    assert B * chunk <= bench.PREFILL_TOKENS
    assert B * chunk * S <= bench.PREFILL_MASK_ELEMENTS
    # the largest such multiple of 64
    bigger = chunk + 64
    assert B * bigger > bench.PREFILL_TOKENS or B * bigger * S > bench.PREFILL_MASK_ELEMENTS


def test_prefill_chunk_takes_a_requested_size(bench):
    assert bench.prefill_chunk(16, 32768, requested=4096) == 4096
    assert bench.prefill_chunk(1, 1000, requested=4096) == 1000
    # the two sizes that failed on the H200 (session 14, calls A and B) now get 2,048-token chunks
    assert bench.prefill_chunk(4, 131072) == 2048 and bench.prefill_chunk(16, 32768) == 2048


def test_a_case_in_progress_is_written_as_a_partial_row(bench, tmp_path, monkeypatch):
    """A call cut short (the device's time limit, session 15) keeps the parts of a case it measured: the
    file holds the case's rows so far, marked partial, after the static rows and again after GAAC's eager
    steps; the finished case replaces it without the mark. --tiny runs the script on the CPU."""
    import copy
    import json

    writes = []
    real = bench.harness.write_result

    def record(path, data, shapes=None):
        writes.append(copy.deepcopy(data))
        return real(path, data, shapes)

    monkeypatch.setattr(bench.harness, "write_result", record)
    monkeypatch.setattr(bench, "gpu_busy_us", lambda step, n: 1.0)  # no CUDA profiler on the CPU
    out = tmp_path / "e2e.json"
    bench.main(["--tiny", "--contexts", "256", "--batches", "1", "--steps", "1", "--prof-steps", "1",
                "--prefill-reps", "1", "--skip-dynamic", "--out", str(out)])
    partial = [w["rows"][-1] for w in writes if w["rows"] and w["rows"][-1].get("partial")]
    statics_only = [r for r in partial if "step_wall_us_static_cudnn" in r and "step_wall_us_gaac" not in r]
    with_gaac = [r for r in partial if "step_wall_us_gaac" in r]
    assert statics_only and with_gaac, [sorted(r) for r in partial]
    final = json.loads(out.read_text())["rows"]
    assert len(final) == 1 and "partial" not in final[0]
    assert final[0]["step_wall_us_static_cudnn"] == statics_only[-1]["step_wall_us_static_cudnn"]
    assert "speedup_wall_vs_static_cudnn" in final[0]


def test_kernel_table_records_the_busy_union_per_kind(bench, tmp_path, monkeypatch):
    """--kernel-table: each cache kind's row gets step_busy_us_<kind> from its kernel_gaps (the union of kernel
    intervals, which programmatic dependent launch keeps apart from the summed step_gpu_us)."""
    import json

    def fake(step, n, kernels=None, gaps=None):  # what the profiler would fill, with a busy union per kind
        step()
        kernels.update({"k": {"us": 2.0, "calls": 1.0}})
        gaps.update({"total_us": 0.25, "busy_us": 0.75 + len(fake.seen), "after": {}})
        fake.seen.append(1)
        return 1.0

    fake.seen = []
    monkeypatch.setattr(bench, "gpu_busy_us", fake)
    out = tmp_path / "e2e.json"
    bench.main(["--tiny", "--contexts", "256", "--batches", "1", "--steps", "1", "--prof-steps", "1",
                "--prefill-reps", "1", "--skip-dynamic", "--kernel-table", "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    kinds = [k.removeprefix("step_gpu_us_") for k in row if k.startswith("step_gpu_us_")]
    assert "gaac" in kinds and "static_cudnn" in kinds
    for kind in kinds:
        assert row[f"step_busy_us_{kind}"] == row["kernel_gaps"][kind]["busy_us"]
    assert len({row[f"step_busy_us_{kind}"] for kind in kinds}) == len(kinds)  # each kind its own


def test_merge_e2e_keeps_each_rows_commit_and_replaces_an_out_of_memory_row(tmp_path):
    """eval/merge_e2e.py: rows carry their run's commit and gpu_ms / wall_ms per cache kind; a later run's row
    with a GAAC time replaces an earlier one without (a rerun after running out of memory), not the reverse."""
    import json

    spec = importlib.util.spec_from_file_location("merge_e2e", EVAL / "merge_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(commit, rows):
        p = tmp_path / f"{commit}.json"
        p.write_text(json.dumps(dict(commit=commit, dirty=False, command=f"bench {commit}", rows=rows)))
        return str(p)

    ok = dict(batch=1, context=64, step_gpu_us_static_cudnn=2000.0, step_gpu_us_gaac=1500.0, step_wall_us_gaac=9000.0)
    oom = dict(batch=16, context=32, step_gpu_us_static_cudnn=4000.0, oom_gaac="CUDA out of memory")
    fixed = dict(batch=16, context=32, step_gpu_us_static_cudnn=4100.0, step_gpu_us_gaac=3000.0)
    m = mod.merge(str(tmp_path / "out.json"), [run("aaa", [ok, oom]), run("bbb", [fixed]), run("ccc", [oom])])
    rows = {(r["batch"], r["context"]): r for r in m["rows"]}
    assert rows[(1, 64)]["commit"] == "aaa" and rows[(1, 64)]["gpu_ms"] == {"static_cudnn": 2.0, "gaac": 1.5}
    assert rows[(1, 64)]["wall_ms"] == {"gaac": 9.0}
    assert rows[(16, 32)]["commit"] == "bbb" and rows[(16, 32)]["gpu_ms"]["gaac"] == 3.0
    assert [p["commit"] for p in m["parts"]] == ["aaa", "bbb", "ccc"] and m["commit"] == "ccc"


def test_kernel_gaps_charge_idle_time_to_the_kernel_that_ends_it():
    import sys
    sys.path.insert(0, str(EVAL))
    from harness import kernel_gaps

    # two calls of a step: a (0-10), b overlaps a (5-12), c after a 3 us gap (15-20); then a again after 30 us
    ev = [("a", 0, 10), ("c", 15, 20), ("b", 5, 12), ("a", 50, 60), ("c", 61, 62), ("b", 60, 61)]
    g = kernel_gaps(ev, steps=2)
    assert g["total_us"] == (3 + 30) / 2
    assert g["busy_us"] == (12 + 5 + 12) / 2  # 0-12 and 15-20, then 50-62: overlaps count once
    assert g["after"]["c"] == {"us": 1.5, "count": 0.5}  # 15 - 12; c at 61 follows b's end exactly: no gap
    assert g["after"]["a"] == {"us": 15.0, "count": 0.5}
    assert "b" not in g["after"]  # b starts inside a
    assert list(g["after"]) == ["a", "c"]  # most idle time first
    assert kernel_gaps(ev, steps=2, top=1)["after"].keys() == {"a"}
    # a short kernel inside a long one does not end the long one's busy time
    assert kernel_gaps([("x", 0, 100), ("y", 10, 20), ("z", 50, 60), ("w", 104, 105)], steps=1) == \
        {"total_us": 4.0, "busy_us": 101.0, "after": {"w": {"us": 4.0, "count": 1.0}}}
