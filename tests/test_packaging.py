"""What `pip install` puts on a machine matches what the code uses: every declared dependency is
imported by the package (none declared for nothing, as einops once was), every workload set
of workloads/ — the standard suite, the GPU and the scaling sets — ships as package data, and the
install adds one top-level package, `dohnuts`, the built-in plugins inside it (issue 34: they were
once a top-level package of their own, a generic name beside every other in site-packages)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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


def test_one_top_level_package_the_builtin_plugins_inside_it():
    """`pip install` adds `dohnuts` alone to site-packages: the built-in plugins are
    `dohnuts.bench.builtin` (no top-level package of their own, as they once had), and every
    entry point of the group names a module that exists there."""
    project = _project()
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["dohnuts*"]
    for name, module in project["project"]["entry-points"]["dohnuts_bench"].items():
        assert module.startswith("dohnuts.bench.builtin."), name
        path = ROOT / module.replace(".", "/")
        assert (path / "__init__.py").is_file() or path.with_suffix(".py").is_file(), module
    # the checkout's only top-level packages: dohnuts, and tests (never installed)
    assert sorted(p.parent.name for p in ROOT.glob("*/__init__.py")) == ["dohnuts", "tests"]


def test_the_built_wheel_holds_dohnuts_alone(tmp_path):
    """The wheel setuptools builds from this checkout (no network: this environment's setuptools)
    holds `dohnuts/` and its metadata and nothing else, declares `dohnuts` its one top-level
    package, and every `dohnuts_bench` entry point it registers is a module inside it."""
    pytest.importorskip("setuptools")
    pytest.importorskip("pip")
    src = tmp_path / "src"
    src.mkdir()
    # the whole checkout (a second top-level package would show), less what is built or big and local
    heavy = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.safetensors", "checkpoints", "runs", "*.sqlite*")
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in ("build", "dist") or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, src / entry.name, symlinks=True, ignore=heavy)
        else:
            shutil.copy2(entry, src / entry.name, follow_symlinks=False)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("dohnuts-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        top = {n.split("/")[0] for n in names}
        assert top == {"dohnuts", info}, f"the wheel installs more than dohnuts: {sorted(top - {info})}"
        assert zf.read(f"{info}/top_level.txt").decode().split() == ["dohnuts"]
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    group = entry_points.split("[dohnuts_bench]", 1)[1].split("\n[", 1)[0]
    modules = dict(line.split(" = ") for line in group.strip().splitlines())
    assert set(modules) == set(_project()["project"]["entry-points"]["dohnuts_bench"])
    for name, module in modules.items():
        path = module.replace(".", "/")
        assert f"{path}/__init__.py" in names or f"{path}.py" in names, (name, module)
