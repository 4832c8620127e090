"""The tuned-configuration table: a fresh GPU skips autotuning of the kernels we have measured.

Triton's autotuners (fla's and dohnuts') time every candidate configuration of a kernel at a new
tuning key, compiling each: on a fresh H200 that was minutes before the first result (KI-4). They
keep their choice on disk (`cache_results=True`: a `<kernel>.autotune.json` in a Triton cache
directory whose name hashes Triton's own version, the GPU backend and architecture, the kernel's
source, the cache-invalidating environment, the tuning key and the candidates). The table
`tuned/<gpu>.json` holds those files from a measured machine; `seed()` writes every entry this
cache lacks before the first kernel runs. Only an exact match is ever read back — a different GPU,
Triton, fla or kernel source hashes to another directory, and that kernel tunes as before. So the
table can make a first call faster, never different from what tuning on that machine once chose.

The table names the machine it was made for by `fingerprint()` (Triton's key and the backend's
hash): on any other machine `seed()` writes nothing and says once on stderr that kernels will be
tuned at first use. Each entry also records the SHA-256 of its kernel's source, so a CPU test
fails when a kernel changes and its entry is stale (remake the table: `benchmarks/maintainers/tuned_table.py`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from pathlib import Path

import torch

TABLES = Path(__file__).with_name("tuned")


def fingerprint() -> str:
    """Triton's version key and the active GPU backend's hash (architecture, ptxas/LLVM): what
    every autotune cache directory name starts from."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    import triton.runtime.autotuner as autotuner  # the names its disk cache uses, wherever they live
    from triton.compiler.compiler import make_backend

    backend = make_backend(autotuner.driver.active.get_current_target()).hash()
    return hashlib.sha256(f"{autotuner.triton_key()}-{backend}".encode()).hexdigest()


def source_digest(kernel) -> str:
    """SHA-256 of a Triton kernel's Python source and the line it starts on (an Autotuner, a
    heuristics wrapper or a JITFunction). Triton keys a kernel's autotune cache by both
    (`JITFunction.cache_key`): a kernel moved down its file misses its table entry as surely as an
    edited one, and autotunes again at its first launch (docs/history/evolution.md M44)."""
    fn = kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    lines, start = inspect.getsourcelines(fn)
    return hashlib.sha256(f"{start}\n{''.join(lines)}".encode()).hexdigest()


def load_tables() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(TABLES.glob("*.json"))]


@functools.cache
def seed() -> int:
    """Write the matching table's autotune entries this Triton cache lacks (once a process).
    Returns how many it wrote; on a machine no table was made for, says so once on stderr."""
    if not torch.cuda.is_available():
        return 0
    try:
        mine = fingerprint()
    except Exception as err:  # an unknown backend: Triton tunes as it always did
        print(f"dohnuts: no tuned-kernel table applies ({type(err).__name__}: {err}); Triton kernels are "
              "tuned at their first use", file=sys.stderr)
        return 0
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from triton.runtime.cache import get_cache_manager

    written = 0
    for table in load_tables():
        if table["fingerprint"] != mine:
            continue
        for entry in table["entries"]:
            cache = get_cache_manager(entry["key"])  # the hex key Triton hashed: same directory
            if cache.get_file(entry["file"]) is None:
                cache.put(entry["content"], entry["file"], binary=False)
                written += 1
        return written
    name = torch.cuda.get_device_name()
    print(f"dohnuts: no tuned-kernel table for this GPU and Triton ({name}); Triton kernels are tuned at their "
          "first use (minutes on a fresh machine; kept in the Triton cache afterwards)", file=sys.stderr)
    return 0
