"""What `pip install` puts on a machine matches what the code uses: every declared dependency is
imported by the packages (none declared for nothing, as einops once was), every workload set
of workloads/ — the standard suite, the GPU and the scaling sets — ships as package data, and the
install adds two top-level packages, `dohnuts` and `dohnuts_bench_plugins` (the folder
bench_plugins/, under a name of the project's: issue 34 found the plugins once installed as a
generic `bench_plugins` beside every other package in site-packages), every package listed, the
built-in plugins found through their entry points from an installed wheel."""

from __future__ import annotations

import json
import os
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


def _folders() -> dict[str, Path]:
    """Each installed top-level package → its folder in the checkout (pyproject's package-dir)."""
    setuptools = _project()["tool"]["setuptools"]
    tops = {p.split(".")[0] for p in setuptools["packages"]}
    return {top: ROOT / setuptools.get("package-dir", {}).get(top, top) for top in tops}


def _imported_modules() -> set[str]:
    found = set()
    for folder in _folders().values():
        for path in folder.rglob("*.py"):
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


def test_every_package_is_listed_and_the_plugins_install_under_the_projects_name():
    """setuptools cannot rename a folder it discovers, so pyproject.toml lists the packages: every
    folder with an __init__.py under dohnuts/ and bench_plugins/, under its installed name, and no
    other. The install's top-level names are `dohnuts` and `dohnuts_bench_plugins`; every entry point
    of the group names a module inside the plugins' folder."""
    setuptools = _project()["tool"]["setuptools"]
    assert _folders() == {"dohnuts": ROOT / "dohnuts", "dohnuts_bench_plugins": ROOT / "bench_plugins"}
    on_disk = {".".join((top, *init.parent.relative_to(folder).parts))
               for top, folder in _folders().items() for init in folder.rglob("__init__.py")}
    assert sorted(setuptools["packages"]) == sorted(on_disk)
    assert len(on_disk) > 10 and "dohnuts_bench_plugins.targets" in on_disk  # it found the plugins' packages
    for name, module in _project()["project"]["entry-points"]["dohnuts_bench"].items():
        top, *rest = module.split(".")
        assert top == "dohnuts_bench_plugins", name
        path = ROOT / "bench_plugins" / "/".join(rest)
        assert (path / "__init__.py").is_file() or path.with_suffix(".py").is_file(), module
    # the checkout's only top-level packages: dohnuts, bench_plugins (installed renamed) and tests (never installed)
    assert sorted(p.parent.name for p in ROOT.glob("*/__init__.py")) == ["bench_plugins", "dohnuts", "tests"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel setuptools builds from a copy of this checkout (no network: this environment's
    setuptools and pip)."""
    pytest.importorskip("setuptools")
    pytest.importorskip("pip")
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"
    src.mkdir()
    # the whole checkout (a stray top-level package would show), less what is built or big and local
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
    (built_wheel,) = (tmp_path / "dist").glob("dohnuts-*.whl")
    return built_wheel


def test_the_built_wheel_holds_dohnuts_and_its_plugins_alone(wheel):
    """The wheel holds `dohnuts/`, `dohnuts_bench_plugins/` (the folder bench_plugins/, every file
    of it) and its metadata, and nothing else; it declares those two top-level packages, and every
    `dohnuts_bench` entry point it registers is a module inside the plugins."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        top = {n.split("/")[0] for n in names}
        assert top == {"dohnuts", "dohnuts_bench_plugins", info}, f"the wheel installs {sorted(top - {info})}"
        assert sorted(zf.read(f"{info}/top_level.txt").decode().split()) == ["dohnuts", "dohnuts_bench_plugins"]
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    plugin_files = {f"dohnuts_bench_plugins/{p.relative_to(ROOT / 'bench_plugins').as_posix()}"
                    for p in (ROOT / "bench_plugins").rglob("*.py")}
    assert plugin_files and plugin_files <= set(names)
    group = entry_points.split("[dohnuts_bench]", 1)[1].split("\n[", 1)[0]
    modules = dict(line.split(" = ") for line in group.strip().splitlines())
    assert modules == _project()["project"]["entry-points"]["dohnuts_bench"]
    for name, module in modules.items():
        path = module.replace(".", "/")
        assert f"{path}/__init__.py" in names or f"{path}.py" in names, (name, module)


INSTALLED_PLUGINS = """
import importlib.metadata, json
import dohnuts
from dohnuts.bench.plugins import checkout_entry_points, collect, plugin_manager
pm = plugin_manager()
print(json.dumps({
    "dohnuts": dohnuts.__file__,
    "distribution": str(importlib.metadata.distribution("dohnuts").locate_file("")),
    "checkout": [ep.name for ep in checkout_entry_points()],
    "plugins": {name: plugin.__file__ for name, plugin in pm.list_name_plugin()},
    "kinds": sorted(collect(pm, "dohnuts_bench_register_workload_kinds")),
    "targets": sorted(collect(pm, "dohnuts_bench_register_targets")),
}))
"""


def test_the_installed_wheel_finds_its_plugins_through_their_entry_points(wheel, tmp_path):
    """Installed (pip install --target, outside any checkout), `dohnuts` reads the wheel's metadata
    alone: every built-in plugin is the installed `dohnuts_bench_plugins` module its entry point
    names, and the built-in workload kinds and targets are registered."""
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", INSTALLED_PLUGINS], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert Path(seen["dohnuts"]).parent == target / "dohnuts"
    assert Path(seen["distribution"]) == target and seen["checkout"] == []
    declared = _project()["project"]["entry-points"]["dohnuts_bench"]
    assert set(seen["plugins"]) == set(declared)
    for name, module in declared.items():
        assert Path(seen["plugins"][name]) == target / module.replace(".", "/") / "__init__.py", name
    assert {"text", "image", "train-step", "requests"} <= set(seen["kinds"])
    assert {"dohnuts", "transformers", "transformers+peft"} <= set(seen["targets"])
