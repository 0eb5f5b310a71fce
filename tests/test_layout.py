"""The package's shape (docs/ARCHITECTURE.md): imports run one way between layers, no import circle,
no module over ~600 lines, nothing in the product imports the lab. Reads source files only."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 600

#: layer of each top-level part of the package: a module may import its own layer or lower ones
LAYERS = {
    "gaac_hf.format": 0, "gaac_hf.data": 0, "gaac_hf.models": 0,
    "gaac_hf.codec": 1,
    "gaac_hf.kernels": 2, "gaac_hf.calibration": 2, "gaac_hf.calibration_data": 2,
    "gaac_hf.cache": 3,
    "gaac_hf.integrations": 4, "gaac_hf.demo": 4,
    "gaac_hf": 5,  # the root __init__: the public names
}


def _modules() -> dict[str, Path]:
    """Module name -> file, for gaac_hf/ and kernels/ (installed as gaac_hf.kernels)."""
    out = {}
    for root, prefix in ((REPO / "gaac_hf", "gaac_hf"), (REPO / "kernels", "gaac_hf.kernels"),
                         (REPO / "calibration_data", "gaac_hf.calibration_data")):
        for f in root.rglob("*.py"):
            if "tasks" in f.relative_to(root).parts:  # lm-eval task helpers: loaded by lm-eval as files
                continue
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """gaac_hf modules that ``name`` imports anywhere in its file (function bodies included),
    plus the packages above each (Python runs their __init__ first)."""
    is_pkg = path.name == "__init__.py"
    pkg = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            while t.startswith("gaac_hf"):
                if t in modules and t != name:
                    found.add(t)
                t = t.rpartition(".")[0]
    return found


def _layer(mod: str) -> int:
    while mod not in LAYERS:
        mod = mod.rpartition(".")[0]
    return LAYERS[mod]


def test_no_import_circle_and_imports_run_down_the_layers():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    upward = [(m, d) for m, deps in graph.items() for d in deps
              if _layer(d) > _layer(m) and not m.startswith(d + ".")]
    assert not upward, f"imports against the layer order: {upward}"
    # depth-first search for a cycle; a package's own __init__ importing its children is not one
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in graph[m]:
            if m.startswith(d + "."):
                continue  # a module's parent package is already running (or done) when it runs
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_no_module_over_600_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_product_and_eval_never_import_the_lab():
    for root in (REPO / "gaac_hf", REPO / "kernels", REPO / "eval", REPO / "tests"):
        for f in root.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n == "lab" or n.startswith("lab.") for n in names), f"{f} imports lab"
            assert '"lab"' not in f.read_text() or f.name == "test_layout.py", f"{f} reaches into lab/"


def test_the_layout_check_sees_a_planted_upward_import(tmp_path):
    """Sanity of the checker itself: codec importing the cache is flagged."""
    modules = _modules()
    fake = tmp_path / "reference.py"
    fake.write_text("from ..cache import GAACCache\n")
    deps = _imports("gaac_hf.codec.reference", fake, modules)
    assert "gaac_hf.cache" in deps and _layer("gaac_hf.cache") > _layer("gaac_hf.codec.reference")


def test_cache_keyword_follows_the_forward_signature():
    """One helper names the cache keyword for every caller (calibration, lm-eval, CUDA graphs)."""
    from gaac_hf.models import cache_keyword, cache_kwargs

    def new(input_ids, cache=None): ...

    def old(input_ids, past_key_values=None): ...

    class Model:
        forward = staticmethod(new)

    assert cache_keyword(new) == "cache" and cache_keyword(Model()) == "cache"
    assert cache_keyword(old) == "past_key_values"
    assert cache_keyword(min) == "past_key_values"  # no readable signature: the name every release accepts

    class Old:
        forward = staticmethod(old)

        def generate(self, inputs=None, cache=None, **kwargs): ...  # generate follows forward, whatever it names

    assert cache_keyword(Old().generate) == "past_key_values" and cache_keyword(Model()) == "cache"
    assert cache_keyword(Old()) == "past_key_values"  # asked twice: the cached answer is per function
    assert cache_kwargs(Old().generate, 7) == {"past_key_values": 7}

    import gaac_hf.models as M

    m = Model()
    m.forward = lambda input_ids, cache=None: None  # an instance-level wrapper (it may hold a model): not kept
    before = len(M._KEYWORDS)
    assert cache_keyword(m) == "cache" and len(M._KEYWORDS) == before
