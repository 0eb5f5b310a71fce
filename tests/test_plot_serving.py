"""eval/plot_serving.py merges serving runs measured in separate device calls, and bench_serving's
--bf16-from refuses an earlier run of other requests (CPU, synthetic results)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

EVAL = Path(__file__).resolve().parents[1] / "eval"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EVAL / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, name, gb, prompts, tokens_per_s, **extra):
    side = dict(max_concurrent=3, tokens_per_s=tokens_per_s, blocks=10, kv_bytes_per_token=100.0)
    row = dict(budget_bytes=gb << 30, bf16=dict(side), gaac=dict(side, max_concurrent=4, kv_bytes_per_token=74.0))
    data = dict(model="m", device="cuda", gpu="G", commit=name, command=f"bench {name}", prompt_tokens=prompts,
                new_tokens=8, requests=len(prompts), limits=dict(max_batch_tokens=64), versions={"transformers": "x"},
                rows=[row], **extra)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_merge_keeps_every_row_with_its_own_run(tmp_path):
    plot = _load("plot_serving")
    b = _run(tmp_path, "b", 16, [3000, 5000], 2.0)
    a = _run(tmp_path, "a", 8, [1024, 2048, 4096], 1.0)
    out = tmp_path / "merged.json"
    plot.main([str(out), "--merge", str(b), str(a)])
    got = json.loads(out.read_text())
    assert [r["budget_bytes"] >> 30 for r in got["rows"]] == [8, 16]  # sorted by budget
    assert [r["part"] for r in got["rows"]] == [1, 0]
    assert [p["commit"] for p in got["parts"]] == ["b", "a"]
    assert got["parts"][1]["prompt_tokens"] == [1024, 2048, 4096]
    assert got["rows"][0]["bf16"]["tokens_per_s"] == 1.0 and got["rows"][1]["bf16"]["tokens_per_s"] == 2.0
    assert "prompt_tokens" not in got  # runs differ: it lives per part only
    assert out.with_suffix(".png").stat().st_size > 0


def test_merge_refuses_partial_runs_and_mixed_models(tmp_path):
    plot = _load("plot_serving")
    a = _run(tmp_path, "a", 8, [1024], 1.0)
    cut = _run(tmp_path, "cut", 16, [1024], 1.0, partial=True)
    with pytest.raises(SystemExit, match="partial"):
        plot.merge(tmp_path / "o.json", [a, cut])
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(json.loads(a.read_text()), model="n")))
    with pytest.raises(SystemExit, match="different models"):
        plot.merge(tmp_path / "o.json", [a, other])


def test_bf16_from_checks_it_served_the_same_requests(tmp_path):
    bench = _load("bench_serving")
    a = _run(tmp_path, "a", 8, [1024, 2048], 1.0)
    this = dict(model="m", prompt_tokens=[1024, 2048], new_tokens=8, limits=dict(max_batch_tokens=64))
    rows = bench._earlier_bf16(a, this)
    assert rows == {8 << 30: json.loads(a.read_text())["rows"][0]["bf16"]}
    with pytest.raises(SystemExit, match="prompt_tokens"):
        bench._earlier_bf16(a, dict(this, prompt_tokens=[1024, 2049]))
    with pytest.raises(SystemExit, match="new_tokens"):
        bench._earlier_bf16(a, dict(this, new_tokens=9))


def test_mean_decoding_is_the_time_weighted_count_of_decoding_requests():
    from types import SimpleNamespace as O

    bench = _load("bench_serving")
    # two requests decoding over [1, 5] and [3, 9] of a 10 s run: 4 + 6 = 10 request-seconds -> 1.0
    outs = [O(timestamps=[1.0, 2.0, 5.0]), O(timestamps=[3.0, 9.0]), O(timestamps=[4.0]), O(timestamps=[])]
    assert bench.mean_decoding(outs, 10.0) == pytest.approx(1.0)
    assert bench.mean_decoding(outs, 5.0) == pytest.approx(2.0)
    assert bench.mean_decoding([], 10.0) == 0.0 and bench.mean_decoding(outs, 0.0) == 0.0


def test_max_decoding_is_the_deepest_overlap_of_decode_spans():
    from types import SimpleNamespace as O

    bench = _load("bench_serving")
    # spans [1, 5], [3, 9], [5, 6] (starts when the first ends: no overlap with it), [4, 4.5]; one-token and empty skipped
    outs = [O(timestamps=[1.0, 2.0, 5.0]), O(timestamps=[3.0, 9.0]), O(timestamps=[5.0, 6.0]), O(timestamps=[4.0, 4.5]),
            O(timestamps=[4.2]), O(timestamps=[])]
    assert bench.max_decoding(outs) == 3  # at t = 4.2: [1, 5], [3, 9], [4, 4.5]
    assert bench.max_decoding(outs[:3]) == 2 and bench.max_decoding([]) == 0
