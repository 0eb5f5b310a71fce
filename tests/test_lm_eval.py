"""lm-eval integration: the hf-gaac model, the offline tasks shipped as package data and the parity check.

The parity test runs eval/parity.py on every local task with a tiny --limit (BF16 DynamicCache vs
GAAC, same chunked prefill) and fails if any per-sample output differs; a second test perturbs the
GAAC logits to prove the comparison does fail then. The CLI test runs ``gaac-lm-eval``'s module from
another working directory, offline.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaac_hf.kernels.cpu import native

REPO = Path(__file__).resolve().parents[1]
TASKS = Path(importlib.util.find_spec("gaac_hf.integrations.lm_eval").origin).parent / "tasks"  # package data
SHIPPED_TABLE = REPO / "calibration_data" / "smollm2-135m.safetensors"

pytestmark = pytest.mark.slow


def _require_task_data():
    from gaac_hf.data import DataNotFound, data_file

    try:
        for rel in ("piqa/valid.jsonl", "gsm8k/test.jsonl", "humaneval/HumanEval.jsonl.gz", "wikitext-2-raw-v1/wiki.test.raw"):
            data_file(rel)
    except DataNotFound as e:
        pytest.skip(f"real task data not available: {e}", allow_module_level=True)


_require_task_data()


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def parity():
    return _load(REPO / "eval" / "parity.py", "gaac_parity")


def _shipped_or_made(tmp_path_factory, name: str, *args: str) -> Path:
    """A shipped SmolLM2 table; a small one made on the spot (gaac-calibrate ``args``) if a checkout lacks it."""
    shipped = REPO / "calibration_data" / f"{name}.safetensors"
    if shipped.is_file():
        return shipped
    out = tmp_path_factory.mktemp("cal") / f"{name}.safetensors"
    subprocess.run([sys.executable, "-m", "gaac_hf.calibration.cli", "--model", "smollm2", *args, "--out", str(out),
                    "--quiet"], check=True)
    return out


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    return _shipped_or_made(tmp_path_factory, SHIPPED_TABLE.stem, "--context", "1024", "--max-tokens", "2048",
                            "--stats-tokens", "2048")


@pytest.fixture(scope="module")
def fp8_table(tmp_path_factory) -> Path:
    return _shipped_or_made(tmp_path_factory, "smollm2-135m-fp8_e4m3", "--kv-dtype", "fp8_e4m3", "--context", "512",
                            "--max-tokens", "1024")


# ---------------------------------------------------------------------------------------------
# no model needed
# ---------------------------------------------------------------------------------------------
def test_model_registered_only_by_its_module():
    code = ("import gaac_hf, lm_eval.api.registry as r; a = 'hf-gaac' in r.model_registry; "
            "import gaac_hf.integrations.lm_eval.model; b = r.get_model('hf-gaac').__name__; print(a, b)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "GAACLM"]


ENTRY_POINT_RUN = """
import importlib.metadata as md, json, sys
import lm_eval, lm_eval.api.registry as r
from gaac_hf.integrations.lm_eval import task_manager

# what lm-eval releases after 0.4.13 do with the `lm_eval.models` group (0.4.13's registry already takes
# EntryPoint placeholders; it only does not scan the group itself)
eps = [ep for ep in md.entry_points(group="lm_eval.models") if ep.name == "hf-gaac"]
for ep in eps:
    r.model_registry.register(ep.name, target=ep)
before = "gaac_hf.integrations.lm_eval.model" in sys.modules
cls = r.get_model("hf-gaac")
res = lm_eval.simple_evaluate(model="hf-gaac", model_args=sys.argv[1], tasks=["gaac_piqa"], limit=1,
                              task_manager=task_manager(["gaac_piqa"]), bootstrap_iters=0,
                              verbosity="WARNING")
print(json.dumps({"entry_points": [ep.value for ep in eps], "imported_before_lookup": before,
                  "cls": f"{cls.__module__}:{cls.__qualname__}", "model": res["config"]["model"],
                  "acc": res["results"]["gaac_piqa"]["acc,none"], "n": res["n-samples"]["gaac_piqa"]["effective"]}))
"""


def test_entry_point_resolves_through_lm_eval_registry(table, tmp_path):
    """`lm_eval --model hf-gaac` on lm-eval releases that read entry points: the declared entry point,
    found in the installed distribution's metadata and registered lazily in lm-eval's own registry (as
    those releases do), resolves to GAACLM and runs a shipped task by name, offline, from another
    directory. (Without `_register_once` the module's own registration collides with the placeholder.)"""
    args = f"pretrained=smollm2,gaac=true,calibration={table},prefill_chunk=64,max_length=512"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", ENTRY_POINT_RUN, args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["entry_points"] == ["gaac_hf.integrations.lm_eval.model:GAACLM"], rep
    assert not rep["imported_before_lookup"] and rep["cls"] == rep["entry_points"][0], rep
    assert rep["model"] == "hf-gaac" and rep["n"] == 1 and rep["acc"] in (0.0, 1.0), rep


def test_shipped_entry_point_matches_setup_cfg():
    """The entry point the installed metadata carries is the one setup.cfg declares (a stale editable
    install would test an old target)."""
    import configparser
    import importlib.metadata as md

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    declared = dict(line.split("=", 1) for line in cfg["options.entry_points"]["lm_eval.models"].strip().splitlines())
    declared = {k.strip(): v.strip() for k, v in declared.items()}
    found = {ep.name: ep.value for ep in md.entry_points(group="lm_eval.models") if ep.name in declared}
    assert declared == {"hf-gaac": "gaac_hf.integrations.lm_eval.model:GAACLM"} and found == declared


def test_shipped_tasks_skip_lm_eval_task_index():
    """Only shipped tasks asked for: lm-eval's own task index is not built (parity, gaac-lm-eval); any other
    task name brings it back."""
    from gaac_hf.integrations.lm_eval import cli, only_shipped, task_manager

    assert only_shipped(["gaac_piqa", "gaac_wikitext"]) and not only_shipped(["gaac_piqa", "hellaswag"])
    assert set(task_manager(["gaac_piqa"]).all_tasks) == {"gaac_piqa", "gaac_gsm8k", "gaac_humaneval", "gaac_wikitext"}
    assert cli._option(["--model", "hf-gaac", "--tasks", "a,b", "--limit", "2"], "--tasks") == "a,b"
    assert cli._option(["--tasks=gaac_piqa"], "--tasks") == "gaac_piqa" and cli._option(["--limit", "2"], "--tasks") is None


def test_comparison_is_exact(parity):
    x = -12.5
    assert parity.same([[(x, True)]], [[(float("-12.5"), True)]])
    one_ulp = x + abs(x) * 2**-52
    assert one_ulp != x and not parity.same([[(x, True)]], [[(one_ulp, True)]])
    assert not parity.same([[(x, True)]], [[(x, False)]])
    assert not parity.same(["def f():\n    return 1"], ["def f():\n    return 1 "])
    assert parity.same([float("nan")], [float("nan")])
    ref = [{"doc_id": i, "arguments": [["ctx", " a"]], "resps": [[(-1.0 * i, False)]], "filtered_resps": [(-1.0 * i, False)]}
           for i in range(3)]
    new = json.loads(json.dumps(ref))
    for s in new:  # json turns tuples into lists: compare the same shapes
        s["resps"] = [[tuple(r) for r in rr] for rr in s["resps"]]
        s["filtered_resps"] = [tuple(r) for r in s["filtered_resps"]]
    assert parity.compare_samples(ref, new)["identical"]
    new[1]["resps"] = [[(-1.0 + 1e-12, False)]]
    c = parity.compare_samples(ref, new)
    assert not c["identical"] and c["different_doc_ids"] == [1]


def test_task_docs_and_limits_parse(parity):
    assert parity.parse_task_docs(["gaac_wikitext=14", "gaac_piqa=1,5"]) == {"gaac_wikitext": [14], "gaac_piqa": [1, 5]}
    assert parity.parse_task_limits(["gaac_gsm8k=3"]) == {"gaac_gsm8k": 3}
    for bad in ("gaac_wikitext", "gaac_wikitext=x", "gaac_wikitext="):
        with pytest.raises(SystemExit, match="--task-docs"):
            parity.parse_task_docs([bad])


def test_task_data_resolves_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tasks = _load(TASKS / "gaac_tasks.py", "gaac_tasks_test")
    assert len(tasks.load_piqa()["test"]) == 1838
    assert len(tasks.load_gsm8k()["test"]) == 1319
    assert len(tasks.load_humaneval()["test"]) == 164
    wt = tasks.load_wikitext()["test"]
    assert len(wt) == 62 and wt[0]["title"] == "Robert Boulter"
    assert tasks.gsm8k_score({"target": "18"}, [" so she makes 9 * 2 = 18 dollars."])["exact_match"] == 1.0


# ---------------------------------------------------------------------------------------------
# real model (SmolLM2-135M, CPU)
# ---------------------------------------------------------------------------------------------
def _tiny_args(table: Path, out: Path, tasks: str, **over) -> list[str]:
    args = {"--calibration": str(table), "--tasks": tasks, "--limit": "2", "--max_length": "512",
            "--prefill_chunk": "64", "--max_gen_toks": "24", "--out": str(out),
            "--threads": "1"}  # one torch thread: ~10x faster on a shared 2-core machine (docs/LM_EVAL.md)
    args.update(over)
    argv = [x for kv in args.items() for x in kv]
    # one WikiText article of 635 tokens (two rolling windows of 512; the first article has 1,430 tokens and took
    # 130 s on a CPU without BF16 matrix instructions); one sample of each generation task (24 greedy tokens each,
    # token by token through the cache): the same comparisons as two, at half the decode steps
    return argv + ["--task-docs", "gaac_wikitext=14", "--task-limit", "gaac_gsm8k=1", "--task-limit", "gaac_humaneval=1"]


def test_parity_tiny(parity, table, tmp_path):
    """Every local task, BF16 vs GAAC: per-sample outputs identical, and GAAC blocks really used."""
    out = tmp_path / "parity_smollm2.json"
    rc = parity.main(_tiny_args(table, out, ",".join(parity.DEFAULT_TASKS)))
    rep = json.loads(out.read_text())
    assert {"model", "tasks", "all_identical", "limit", "command"} <= rep.keys()
    bad = {k: v for k, v in rep["tasks"].items() if not v["identical"]}
    assert rc == 0 and rep["all_identical"] and not bad, f"BF16 and GAAC outputs differ: {bad}"
    assert set(rep["tasks"]) == set(parity.DEFAULT_TASKS)
    for name, t in rep["tasks"].items():
        assert t["n"] >= 1 and t["score_bf16"] == t["score_gaac"], name
        assert t["gaac_cache_calls"] >= t["n"], name
    # loglikelihood requests were scored against encoded blocks, over several prefill chunks
    for name in ("gaac_piqa", "gaac_wikitext"):
        g = rep["tasks"][name]["gaac_cache"]
        assert g["calls_with_encoded_blocks"] == g["calls"] and g["encoded_blocks"] > 0, (name, g)
        # the CPU default format (v3 with the CPU library: decode + SDPA), recorded from the caches' stats
        assert g["format_versions"] == [3 if native.available() else 2], (name, g)
        assert g["seq_length"] > 64 * g["calls"], (name, g)  # more than one 64-token chunk per call


def test_parity_fails_when_outputs_differ(parity, table, tmp_path, monkeypatch):
    import torch

    from gaac_hf.integrations.lm_eval.model import GAACLM

    orig = GAACLM._model_call

    def nudged(self, inps, *a, **kw):
        logits = orig(self, inps, *a, **kw)
        return logits + 0.25 * (torch.arange(logits.shape[-1]) % 2).to(logits.dtype) if self.gaac else logits

    monkeypatch.setattr(GAACLM, "_model_call", nudged)
    out = tmp_path / "parity_bad.json"
    rc = parity.main(_tiny_args(table, out, "gaac_piqa", **{"--limit": "1"}))
    rep = json.loads(out.read_text())
    assert rc == 1 and not rep["all_identical"] and rep["tasks"]["gaac_piqa"]["n_different"] == 1


def test_parity_fp8_tiny(parity, fp8_table, tmp_path):
    """FP8: the FP8 cache without GAAC vs GAACCache(kv_dtype=fp8_e4m3), a loglikelihood and a generation
    task: per-sample outputs identical, encoded FP8 tiles used, report keys say fp8."""
    out = tmp_path / "parity_fp8_smollm2.json"
    rc = parity.main(_tiny_args(fp8_table, out, "gaac_piqa,gaac_gsm8k", **{"--limit": "1"}) + ["--kv-dtype", "fp8_e4m3"])
    rep = json.loads(out.read_text())
    assert rc == 0 and rep["all_identical"], rep["tasks"]
    assert rep["settings"]["kv_dtype"] == "fp8_e4m3" and "FP8DynamicCache" in rep["settings"]["fp8"]
    for name, t in rep["tasks"].items():
        assert t["score_fp8"] == t["score_gaac"] and "score_bf16" not in t, name
    g = rep["tasks"]["gaac_piqa"]["gaac_cache"]
    assert g["encoded_blocks"] > 0 and g["fp8_bytes"] > 0 and g["ratio_vs_fp8"] > 1.0, g


@pytest.mark.full  # CI runs gaac-lm-eval from an installed wheel in another directory (scripts/check_wheel.sh)
def test_cli_offline_from_another_directory(table, tmp_path):
    env = dict(os.environ)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)  # the console script sets the offline defaults itself
    # no --include_path: the console script adds the shipped tasks itself
    cmd = [sys.executable, "-m", "gaac_hf.integrations.lm_eval.cli", "--model", "hf-gaac",
           "--model_args", f"pretrained=smollm2,gaac=true,calibration={table},prefill_chunk=64",
           "--tasks", "gaac_piqa", "--limit", "2",
           "--output_path", str(tmp_path / "out"), "--log_samples"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "gaac_piqa" in r.stdout and "acc" in r.stdout
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert results, "lm-eval wrote no results file"
    rep = json.loads(results[0].read_text())
    assert "acc,none" in rep["results"]["gaac_piqa"]
    assert rep["config"]["model"] == "hf-gaac"
