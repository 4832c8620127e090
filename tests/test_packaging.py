"""What `pip install` puts on a machine matches what the code uses: every declared dependency is
imported by the package (none declared for nothing, as einops once was), and every workload set
of workloads/ — the standard suite, the GPU and the scaling sets — ships as package data."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# distribution → the module it is imported as, where the names differ
IMPORT_NAME = {"fla-core": "fla", "pyyaml": "yaml", "pillow": "PIL", "nvidia-ml-py": "pynvml",
               "scikit-learn": "sklearn"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _imported_modules() -> set[str]:
    found = set()
    packages = _project()["tool"]["setuptools"]["packages"]["find"]["include"]
    roots = {p.rstrip("*").rstrip(".") for p in packages}
    for root in roots:
        for path in (ROOT / root.replace(".", "/")).rglob("*.py"):
            for m in re.finditer(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", path.read_text(encoding="utf-8"), re.M):
                found.add(m.group(1))
    return found


def test_every_declared_dependency_is_imported():
    imported = _imported_modules()
    unused = []
    for requirement in _project()["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        module = IMPORT_NAME.get(name, name.replace("-", "_"))
        if module not in imported:
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"


def test_every_workload_set_is_package_data():
    globs = _project()["tool"]["setuptools"]["package-data"]["dohnuts"]
    assert (ROOT / "dohnuts" / "bench" / "standard").resolve() == (ROOT / "workloads").resolve()
    files = sorted(p.relative_to(ROOT / "workloads") for p in (ROOT / "workloads").rglob("*.yaml"))
    assert any(f.parts[0] == "gpu" for f in files) and any(f.parts[0] == "scaling" for f in files)
    for f in files:
        assert any(_glob_matches(g, f"bench/standard/{f.as_posix()}") for g in globs), f


def _glob_matches(glob: str, path: str) -> bool:
    """setuptools' package-data rule: `*` stays within one folder."""
    return re.fullmatch(re.escape(glob).replace(r"\*", "[^/]*"), path) is not None
