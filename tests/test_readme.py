"""The README stays true: its Python snippet runs as written (CPU, SmolLM2, from another directory),
every result file it cites exists, and CI runs its two commands."""
import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def python_snippet() -> str:
    m = re.search(r"## Use it\n\n```python\n(.*?)```", README, re.S)
    assert m, "README lost its '## Use it' Python snippet"
    return m.group(1)


@pytest.mark.slow
@pytest.mark.full  # CI runs the snippet from an installed wheel (scripts/check_wheel.sh)
def test_readme_snippet_runs_as_written(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(python_snippet())
    r = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-W", "error::DeprecationWarning", str(script)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Paris" in r.stdout and "'ratio':" in r.stdout
    assert "Warning" not in r.stderr, r.stderr[-2000:]


def test_readme_cites_only_result_files_that_exist():
    cited = set(re.findall(r"[\w\-\*]+\.(?:json|png)", README))
    assert cited, "no result files cited?"
    missing = sorted(c for c in cited if not glob.glob(str(REPO / "eval" / "results" / "**" / c), recursive=True))
    assert not missing, f"README cites result files that are not in eval/results/: {missing}"


def test_every_result_records_its_commit():
    """Provenance: every JSON result the README and docs can cite names the commit that made it."""
    import json

    files = sorted((REPO / "eval" / "results").rglob("*.json"))
    assert files
    missing = [str(f.relative_to(REPO)) for f in files if "commit" not in json.loads(f.read_text())]
    assert not missing, f"results without a 'commit' field: {missing}"


def test_ci_runs_the_readme_commands():
    ci = (REPO / ".ci" / "run").read_text()
    for cmd in re.findall(r"```bash\n(bash scripts/install\.sh|python -m pytest -q)\n```", README):
        assert cmd in ci, f"CI does not run the README command {cmd!r}"


def _resolves(path: str) -> bool:
    """``a.b.c`` names an importable module, or an attribute reached from the longest importable prefix."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_import_path_in_the_docs_resolves():
    """Every dotted ``gaac_hf...`` path and every ``from gaac_hf... import X`` in the README and docs/ works
    (old paths are either shims or gone from the text)."""
    text = README + "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    paths = set(re.findall(r"gaac_hf(?:\.[A-Za-z_]\w*)+", text))
    for mod, names in re.findall(r"from (gaac_hf[\w.]*) import ([\w, ]+)", text):
        paths |= {f"{mod}.{n.strip()}" for n in names.split(",") if n.strip()}
    assert len(paths) > 30, sorted(paths)
    bad = sorted(p for p in paths if not _resolves(p))
    assert not bad, f"the README / docs name import paths that do not exist: {bad}"
