"""Run directories of `dohnuts-bench run`: a new one per run, created atomically, and names made
safe to use as one path component (a workload name or label never reaches outside the run
directory)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from dohnuts.errors import ConfigError


def safe_name(name: str) -> str:
    """`name` as one path component: anything but letters, digits, '.', '_', '+' and '-' becomes
    '-' (a workload name or label never reaches outside the run directory)."""
    out = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(name)).strip(".-")[:100]
    return out or "run"


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
