"""The import graph of the two installed packages, `dohnuts` and `dohnuts_bench_plugins`
(bench_plugins/), has no cycle — counting the imports inside functions, which close a cycle as
surely as those at the top, only later — and every import left inside a function says why in a
comment: a dependency heavy or optional (torch before a command's checks, matplotlib, scipy.stats,
Triton and fla on a GPU, the peer's transformers), or a module that must be looked up where it
runs. A comment on the statement's line, or on the line above it (or above the run of import
statements it belongs to, blank lines between them allowed), is the reason.

Edges go from a module to each module it names (`from dohnuts.bench.store import rundir` names
`dohnuts.bench.store.rundir`); a package's `__init__` run on the way is not an edge of its own, as
Python runs it before either module. Imports under `if TYPE_CHECKING:` are not run, and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layout import PKG, PLUGINS, ROOT, _module_name, _source_files, import_cycles


def _in_function(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _named_modules(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of the two packages an import statement of module `name` names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    named = {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return named & known


def import_statements(source: str, name: str, is_package: bool, known: set[str]):
    """(statement, the modules it names, whether it sits inside a function) of every import run."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _type_checking_only(node, parents):
            yield node, _named_modules(node, name, is_package, known) - {name}, _in_function(node, parents)


def full_import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module → the modules it imports, at its top or inside its functions."""
    known = set(sources)
    return {name: set().union(set(), *(named for _, named, _ in import_statements(src, name, pkg, known)))
            for name, (src, pkg) in sources.items()}


def _sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in _source_files()}


def unexplained_lazy_imports(source: str) -> list[int]:
    """Lines of the imports inside functions that carry no reason: no comment on their lines,
    none on the line above them or above the run of import statements they belong to."""
    lines = source.splitlines()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lazy = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   and _in_function(n, parents) and not _type_checking_only(n, parents)), key=lambda n: n.lineno)
    import_lines = {k for n in lazy for k in range(n.lineno, n.end_lineno + 1)}
    missing = []
    for node in lazy:
        if any("#" in lines[k - 1] for k in range(node.lineno, node.end_lineno + 1)):
            continue
        above = node.lineno - 1
        while above in import_lines or (above >= 1 and not lines[above - 1].strip() and above - 1 in import_lines):
            above -= 1  # the run of imports this one closes (blank lines between sections included)
        if above < 1 or not lines[above - 1].strip().startswith("#"):
            missing.append(node.lineno)
    return missing


def test_the_graph_holds_the_imports_inside_functions():
    graph = full_import_graph(_sources())
    assert len(graph) > 150 and "dohnuts_bench_plugins.targets.peft_target" in graph
    # dohnuts.bench.commands.run imports the session inside `run` (torch after the checks): an edge all the same
    assert "dohnuts.bench.commands.session" in graph["dohnuts.bench.commands.run"]
    assert "dohnuts.bench.plugins" in graph["dohnuts.bench.commands.run"]  # `from dohnuts.bench import plugins`


def test_no_import_cycle_counting_imports_inside_functions():
    cycles = import_cycles(full_import_graph(_sources()))
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


def test_a_cycle_through_a_function_is_found():
    sources = {"dohnuts.a": ("from dohnuts import b\n", False),
               "dohnuts.b": ("def f():\n    # why\n    from dohnuts.a import g\n", False),
               "dohnuts": ("", True)}
    assert import_cycles(full_import_graph(sources)) == [["dohnuts.a", "dohnuts.b"]]
    typed = {**sources, "dohnuts.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dohnuts.a\n",
                                      False)}
    assert import_cycles(full_import_graph(typed)) == []


def test_every_import_inside_a_function_says_why():
    missing = []
    for path in _source_files():
        for line in unexplained_lazy_imports(path.read_text(encoding="utf-8")):
            missing.append(f"{path.relative_to(ROOT)}:{line}")
    assert not missing, ("imports inside functions without a reason comment (hoist them to the top, or say why "
                         "they wait):\n" + "\n".join(missing))


def test_the_reason_check_can_fail():
    source = ("def f():\n"
              "    # matplotlib: only when a figure is drawn\n"
              "    from matplotlib.figure import Figure\n"
              "    from matplotlib.backends.backend_agg import FigureCanvasAgg\n"
              "\n"
              "    import scipy.stats\n"
              "    import json  # the reason on the line\n"
              "    x = 1\n"
              "    import torch\n"
              "    return x\n")
    assert unexplained_lazy_imports(source) == [9]
    assert unexplained_lazy_imports("import torch\n\ndef f():\n    return torch\n") == []


def test_the_two_packages_are_read():
    names = set(_sources())
    assert {"dohnuts.bench.cli", "dohnuts.bench.commands.run", "dohnuts_bench_plugins.reporters"} <= names
    assert all((PKG in p.parents or PLUGINS in p.parents) for p in _source_files())
    assert Path(__file__).name == "test_import_graph.py"
