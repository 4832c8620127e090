"""The repository's top level is the design card's, and the data path's folders keep one
direction: dohnuts/model never imports dohnuts/runtime, dohnuts/train, dohnuts/bench or the
built-in plugins (the pure model cannot depend on the session around it), and only dohnuts/ops
imports fla or Triton. The rules below cover dohnuts/ and bench_plugins/ (the built-in plugins,
installed as the package `dohnuts_bench_plugins`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dohnuts"
PLUGINS = ROOT / "bench_plugins"  # installed as `dohnuts_bench_plugins` (pyproject.toml's package-dir)


def _source_files() -> list[Path]:
    """Every module of the two installed packages: dohnuts/ and bench_plugins/."""
    return sorted(PKG.rglob("*.py")) + sorted(PLUGINS.rglob("*.py"))


def test_the_top_level_is_the_design_cards():
    """The top level the design card fixes (/work/shared/DESIGN.md, "Layout"), and bench_plugins/
    holding the card's plugin folders."""
    for name in ("pyproject.toml", "README.md"):
        assert (ROOT / name).is_file(), name
    for name in ("dohnuts", "bench_plugins", "workloads", "hwspecs", "tests", "results"):
        assert (ROOT / name).is_dir() and not (ROOT / name).is_symlink(), name
    plugin_folders = {p.parent.name for p in PLUGINS.glob("*/__init__.py")}
    assert {"workloads", "targets", "telemetry", "analyzers", "reporters"} <= plugin_folders


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((PKG / "model").glob("*.py")), ids=lambda p: p.name)
def test_model_is_pure(path):
    bad = {n for n in _imports(path) if n.split(".")[:2] in (["dohnuts", "runtime"], ["dohnuts", "train"],
                                                            ["dohnuts", "bench"])
           or n.split(".")[0] == "dohnuts_bench_plugins"}
    assert not bad, f"dohnuts/model/{path.name} imports {sorted(bad)}"


def test_only_ops_imports_kernels():
    for path in _source_files():
        if path.parent == PKG / "ops":
            continue
        kernel = {n for n in _imports(path) if n.split(".")[0] in ("fla", "triton")}
        assert not kernel, f"{path.relative_to(ROOT)} imports {sorted(kernel)}"


# -- no import cycles among dohnuts modules ----------------------------------------------------------


def _module_name(path: Path) -> str:
    """The name a file is imported as: bench_plugins/ is the package `dohnuts_bench_plugins`."""
    if PLUGINS in path.parents:
        parts = ("dohnuts_bench_plugins", *path.relative_to(PLUGINS).with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The dohnuts modules `path` imports when it is imported: statements at module level (inside
    `if`/`try` too, but not in functions, classes or `if TYPE_CHECKING:`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(block)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                for a in node.names:  # `from pkg import module` imports the module
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    visit(ast.parse(path.read_text()).body)
    return {m for m in out if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _source_files()}
    known = set(paths)
    return {name: _module_level_imports(path, name, known) for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_the_cycle_finder_finds_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_dohnuts_modules():
    graph = import_graph()
    workload = graph["dohnuts.bench.measure.workload"]
    assert workload and "dohnuts.schema" in workload  # it reads imports
    assert "dohnuts_bench_plugins.targets.peft_target" in graph["dohnuts_bench_plugins.targets"]  # and the plugins'
    cycles = import_cycles(graph)
    assert not cycles, "module-level import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


# -- one validation and serialization library: the shared helpers are used, not copied -------------

SHARED = PKG / "schema"
# Helpers dohnuts/schema/ holds, which no other module may define again (the issue counted
# `_median` ×3, `_short` ×2, `_finite` ×2, strict-JSON writers ×3 and a Field/check_field mini-library).
SHARED_HELPERS = {"median", "_median", "short", "_short", "finite", "_finite", "_not_finite", "why_not_finite",
                  "_nonfinite", "first_nonfinite", "json_safe", "dumps", "_dumps", "strict_json", "_strict",
                  "write_json", "read_yaml", "yaml_error", "one_line_error", "check_field", "check_fields"}


def _python_files():
    return _source_files()  # the built-in plugins included


def test_shared_helpers_are_defined_once():
    for path in _python_files():
        if path.parent == SHARED:
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        again = defined & (SHARED_HELPERS | {"Field", "StrictLoader", "DuplicateKeyError"})
        assert not again, f"{path.relative_to(PKG.parent)} defines {sorted(again)}: use dohnuts.schema's"


def test_json_is_written_by_the_one_strict_writer():
    """No module but dohnuts/schema/ chooses how JSON is written (allow_nan, orjson)."""
    for path in _python_files():
        if path.parent == SHARED:
            continue
        tree = ast.parse(path.read_text())
        kwargs = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords}
        assert "allow_nan" not in kwargs, f"{path.relative_to(PKG.parent)} writes JSON itself (allow_nan)"
        assert "orjson" not in _imports(path), f"{path.relative_to(PKG.parent)} imports orjson"


def test_one_record_schema_version():
    """`SCHEMA` (the benchmark records' version) is assigned in dohnuts/bench/analysis/records.py only."""
    for path in _python_files():
        tree = ast.parse(path.read_text())
        names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}
        if "SCHEMA" in names:
            assert path == PKG / "bench" / "analysis" / "records.py", f"{path.relative_to(PKG.parent)} sets SCHEMA"
