"""The data path's folders keep one direction: dohnuts/model never imports dohnuts/runtime,
dohnuts/train or dohnuts/bench (the pure model cannot depend on the session around it), and
only dohnuts/ops imports fla or Triton."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dohnuts"


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
                                                            ["dohnuts", "bench"])}
    assert not bad, f"dohnuts/model/{path.name} imports {sorted(bad)}"


def test_only_ops_imports_kernels():
    for path in PKG.rglob("*.py"):
        if path.parent.name == "ops":
            continue
        kernel = {n for n in _imports(path) if n.split(".")[0] in ("fla", "triton")}
        assert not kernel, f"{path.relative_to(PKG)} imports {sorted(kernel)}"
