"""Run directories: `<root>/<YYYYmmdd-HHMMSS>-<label>[-N]`, one per `dohnuts-bench run`, and the
path-safe names of workloads and labels inside them.

What a run derives from a name inside its folder — a workload's `inputs/` folder, a launch's
`ranks/` folder, a profiler trace — cannot collide: `derived_name` keeps a safe name as it is and
gives any other its readable part plus a digest of the whole name (`a b` → `a-b~…`, `a/b` →
`a-b~…`, never one file), and `new_dir` / `new_file` create the path exclusively, with `-N` on a
clash, so no two workloads or launches ever share (or re-read) one folder or file."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from pathlib import Path

from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import stat_path


def safe_name(name: str) -> str:
    """`name` as one path component: anything but letters, digits, '.', '_', '+' and '-' becomes
    '-' (a workload name or label never reaches outside the run directory)."""
    out = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(name)).strip(".-")[:100]
    return out or "run"


SAFE = re.compile(r"[A-Za-z0-9._+-]{1,100}")


def derived_name(name: str) -> str:
    """`name` as one path component, one to one: a name that is already safe (letters, digits and
    `._+-`, not dots alone, at most 100 characters) is kept; any other becomes its `safe_name` and
    `~` and 12 hex digits of its SHA-256 (`~` is never in a kept name, so the two kinds never meet)."""
    name = str(name)
    if SAFE.fullmatch(name) and name.strip("."):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe_name(name)[:80]}~{digest}"


def new_dir(parent: Path, name: str) -> Path:
    """A new, empty folder `parent/name[-N]` (parents made), created atomically: never one that
    another launch or workload made before."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent} already holds 9999 folders named {name}[-N]")


def new_file(parent: Path, stem: str, suffix: str) -> Path:
    """A path `parent/stem[-N]suffix` that no file holds yet, reserved by creating it empty (O_EXCL)."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent} already holds 9999 files named {stem}[-N]{suffix}")


def new_run_dir(root: Path, label: str) -> tuple[str, Path]:
    """A new, empty run directory `<root>/<YYYYmmdd-HHMMSS>-<label>[-N]`, created atomically: two
    runs started in the same second (or in parallel into the same `root`) never share one."""
    root = Path(root)
    try:
        if root.exists() and not root.is_dir():
            raise ConfigError("is not a directory (a folder for run directories)", source=str(root), field="--out")
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError("is not a directory (a folder for run directories)", source=str(root),
                          field="--out") from None
    except (OSError, ValueError) as exc:  # e.g. a file on the way, no permission, an embedded NUL
        raise ConfigError(f"cannot be created ({getattr(exc, 'strerror', None) or exc})", source=str(root),
                          field="--out") from None
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{safe_name(label)}"
    for n in range(1, 10_000):
        path = root / (run_id if n == 1 else f"{run_id}-{n}")
        try:
            path.mkdir()  # atomic: exactly one creator succeeds
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot hold a new run directory ({exc.strerror or exc})", source=str(root),
                              field="--out") from None
        return path.name, path
    raise ConfigError(f"already holds 9999 run directories named {run_id}[-N]", source=str(root), field="--out")


def results_path(arg: str) -> Path:
    """The results file an argument names: a results.jsonl (or .jsonl.gz), or a run directory
    holding one. A path that is missing, too long, a FIFO or a device is one line (the reader
    checks the file's type and size before it opens it)."""
    path = Path(arg)
    st = stat_path(path, error=DohnutsError)
    if stat.S_ISDIR(st.st_mode):  # a run directory (an archived run: results.jsonl.gz)
        plain, archived = path / "results.jsonl", path / "results.jsonl.gz"
        path = plain if os.path.lexists(plain) or not os.path.lexists(archived) else archived
        if not os.path.lexists(path):
            raise DohnutsError("does not exist (expected a run directory or its results.jsonl)", source=str(path))
    return path


def run_inputs(results: Path) -> list[Path]:
    """What a command reading a run reads: its results file and the run.json beside it."""
    return [results, results.parent / "run.json"]


def run_dirs(root: Path) -> list[Path]:
    """Every run directory below `root` (a folder holding results.jsonl or results.jsonl.gz)."""
    found = {p.parent for name in ("results.jsonl", "results.jsonl.gz") for p in root.rglob(name)}
    return sorted(found)
