"""docs/architecture.md stays true: every file, folder and module it names exists (the files its
worked examples create are listed below and must not), every package of dohnuts/ and
bench_plugins/ is described in its Rooms table, and it names the files a newcomer asks for first —
the one that measures a call, the one that computes a bound, the one that writes report.html."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
# the repository's folders a path in the document starts with
TOP = ("dohnuts", "bench_plugins", "tests", "benchmarks", "workloads", "hwspecs", "docs", "results", "scripts")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*)" % "|".join(TOP))
DOTTED = re.compile(r"(?<![\w./-])((?:dohnuts|dohnuts_bench_plugins)(?:\.[A-Za-z_]\w*)+)")
# an installed package name → its folder (pyproject.toml's package-dir)
FOLDER = {"dohnuts": ROOT / "dohnuts", "dohnuts_bench_plugins": ROOT / "bench_plugins"}
# files the worked examples ("Where a change goes") create: named, and not there yet
EXAMPLES_CREATE = {"workloads/long-context.yaml"}


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in PATH.findall(text)}


def _exists(relative: str) -> bool:
    if "*" in relative:
        return any(ROOT.glob(relative))
    return (ROOT / relative).exists()


def _module_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (inside `if`/`try` too)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(block)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def _resolves(dotted: str) -> str | None:
    """None when `dotted` is a module of the two packages, or a module and a name it defines at
    its top level (`dohnuts.model.scorer.choose_pass`); else what is missing."""
    top, *parts = dotted.split(".")
    folder, module = FOLDER[top], FOLDER[top] / "__init__.py"
    for i, part in enumerate(parts):
        if (folder / part / "__init__.py").is_file():
            folder, module = folder / part, folder / part / "__init__.py"
        elif (folder / f"{part}.py").is_file():
            module = folder / f"{part}.py"
            rest = parts[i + 1:]
            break
        else:
            rest = parts[i:]
            break
    else:
        return None
    if rest and rest[0] not in _module_names(module):
        return f"{module.relative_to(ROOT)} defines no {rest[0]}"
    return None


def _rooms() -> list[tuple[str, str]]:
    """(first cell, the rest) of every row of the Rooms table whose first cell is a folder or file."""
    section = _text().split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|(.*)", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def _packages() -> list[str]:
    """Every package of the two installed folders, as `folder/` paths (dohnuts/bench/measure/serving/)."""
    return sorted(f"{init.parent.relative_to(ROOT).as_posix()}/"
                  for folder in FOLDER.values() for init in folder.rglob("__init__.py"))


def test_every_path_it_names_exists():
    named = _named_paths(_text())
    assert len(named) > 40, "the document names its files as paths (the test reads them)"
    missing = sorted(p for p in named - EXAMPLES_CREATE if not _exists(p))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    assert EXAMPLES_CREATE <= named and not any(_exists(p) for p in EXAMPLES_CREATE)


def test_every_module_it_names_exists():
    named = sorted(set(DOTTED.findall(_text())))
    assert len(named) >= 4, "the document names modules as dotted names (the test reads them)"
    missing = [f"{d}: {why}" for d in named if (why := _resolves(d))]
    assert not missing, f"docs/architecture.md names modules or names that do not exist: {missing}"


def test_the_resolver_refuses_what_is_not_there():
    assert _resolves("dohnuts.model.scorer.choose_pass") is None
    assert _resolves("dohnuts_bench_plugins.targets") is None
    assert _resolves("dohnuts.model.scorer.no_such_function")
    assert _resolves("dohnuts.no_such_module")
    assert not _exists("dohnuts/no_such_module.py") and _exists("dohnuts/ops/_*_kernel.py")


def test_the_files_a_rooms_row_names_are_in_its_folder():
    """A row's `text.py`, `analysis/` and `_*_kernel.py` are files and folders of the row's folder."""
    rows = _rooms()
    assert len(rows) >= 6
    missing = []
    for folder, rest in rows:
        for name in re.findall(r"`([\w*]+(?:\.py|/))`", rest):
            if not _exists(f"{folder.rstrip('/')}/{name}"):
                missing.append(f"{folder}: {name}")
    assert not missing, f"the Rooms table names what its folder does not hold: {missing}"


def test_every_package_is_described():
    """Each package of dohnuts/ and bench_plugins/ has its row in the Rooms table, or is named
    (`serving/`) in its parent's row."""
    rows = dict(_rooms())
    undescribed = []
    for package in _packages():
        parent, name = package.rstrip("/").rpartition("/")[::2]
        if package not in rows and f"`{name}/`" not in rows.get(f"{parent}/", ""):
            undescribed.append(package)
    assert len(_packages()) > 10 and not undescribed, f"docs/architecture.md does not describe {undescribed}"


def test_it_names_the_files_a_newcomer_looks_for_first():
    """"Where to look first": the file that measures a call, the one that computes a bound and
    the one that writes report.html, each an existing file (the last one writes that name)."""
    section = _text().split("## Where to look first", 1)[1].split("\n## ", 1)[0]
    for question in ("measures a call", "computes a bound", "writes report.html"):
        line = next((ln for ln in section.splitlines() if question in ln), "")
        files = [p for p in _named_paths(line) if p.endswith(".py")]
        assert files and all((ROOT / f).is_file() for f in files), question
        if question == "writes report.html":
            assert any("report.html" in (ROOT / f).read_text(encoding="utf-8") for f in files)
