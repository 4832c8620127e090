"""The table's recorded kernels compiled on threads, before the first call needs them.

A process that meets an empty Triton cache compiles every kernel at its first launch, one after
another on the thread that launches it: on a fresh H200 that was most of the first call of each
workload (docs/history/evolution.md M39). The kernels a workload launches, and the exact
specialisation of each (its constexprs, argument types, alignment), are the same on every machine
of one GPU and Triton, so the tuned-configuration table (dohnuts.ops._tuned) also records them —
`"compiled"`, each entry one launch's specialisation as Triton serialises it (`JITFunction.preload`'s
input, written by `benchmarks/maintainers/compiled_kernels.py` on the GPU the table is for).

`precompile(device)` hands those entries to a pool of threads, one `preload` each: Triton's
compiler spends its time in C++ passes and in `ptxas`, both outside the GIL, so the compiles run
side by side; each finished kernel lands in the same in-memory cache a launch looks up, and its
launcher is built beside it (`launcher_built`: on Triton 3.6 a C stub the host's compiler builds,
also outside the GIL). Nothing
else changes: a launch whose kernel is not compiled yet compiles it as before (if a thread is
compiling the same one, Triton's disk cache takes both results alike), and an entry that no
longer matches a launch (a changed kernel, another shape) only costs its compile. The table's
fingerprint (`_tuned.fingerprint`) keeps it to the GPU and Triton it was made on; the one path in
a specialisation that depends on where Triton is installed (its libdevice) is rewritten to this
machine's.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from dohnuts.ops import _tuned


@dataclass
class Precompiled:
    """The recorded kernels of one device, compiling on `threads` threads since `started`
    (`time.perf_counter`)."""

    kernels: int
    threads: int
    started: float
    futures: list[Future] = field(default_factory=list)
    finished: float | None = None

    def wait(self) -> dict:
        """Wait for every compile; what happened, for a run's record: kernels, threads, failed
        (compiles that raised: those kernels compile at their launch as before), seconds."""
        failed = [f.exception() for f in self.futures]
        failed = [e for e in failed if e is not None]
        if self.finished is None:
            self.finished = time.perf_counter()
        return {"kernels": self.kernels, "threads": self.threads, "failed": len(failed),
                "seconds": round(self.finished - self.started, 3),
                **({"first_failure": f"{type(failed[0]).__name__}: {failed[0]}"[:300]} if failed else {})}


_STARTED: dict[int, Precompiled | None] = {}
_LOCK = threading.Lock()


def jit_function(module: str, name: str):
    """The JITFunction `name` of `module` (imported here), under any autotuner or heuristics
    wrapper the module binds that name to."""
    # Triton: on a GPU only (and in the tests that compile for one)
    from triton.runtime.jit import JITFunction

    fn = getattr(importlib.import_module(module), name)
    for _ in range(8):  # fla stacks @triton.heuristics over @triton.autotune over @triton.jit
        if isinstance(fn, JITFunction) or not hasattr(fn, "fn"):
            break
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise TypeError(f"{module}.{name} is not a Triton kernel")
    return fn


def localised(data: str, recorded_libdevice: str | None, libdevice: str | None) -> str:
    """A recorded specialisation with the libdevice path it was recorded with replaced by this
    machine's (the path is part of the key a launch computes)."""
    if not recorded_libdevice or not libdevice or recorded_libdevice == libdevice:
        return data
    return data.replace(recorded_libdevice, libdevice)


def local_libdevice(fn, device_index: int) -> str | None:
    """This Triton's libdevice path, as its options for `device_index` give it (None: none used)."""
    _, _, _, backend, _ = fn.device_caches[device_index]
    libs = dict(getattr(backend.parse_options({}), "extern_libs", None) or ())
    return libs.get("libdevice")


def matching_table() -> dict | None:
    """The table made for this GPU and Triton, or None."""
    try:
        mine = _tuned.fingerprint()
    except Exception:  # an unknown backend: `_tuned.seed` says so
        return None
    return next((t for t in _tuned.load_tables() if t["fingerprint"] == mine), None)


def precompile(device: torch.device, *, table: dict | None = None, threads: int | None = None) -> Precompiled | None:
    """Start compiling the table's recorded kernels for `device` on threads (once a process and
    device; later calls return the first one's `Precompiled`). None: nothing recorded for this GPU
    and Triton, or not a CUDA device. `table` and `threads` are the tests' (they compile for a GPU
    target on the CPU, tests/ops/triton_offline.py; default: the matching table, a thread for each
    core this process may run on)."""
    if device.type != "cuda" and table is None:
        return None
    try:
        # Triton: on a GPU only (and in the tests that compile for one)
        from triton.runtime import driver

        index = device.index if device.index is not None else driver.active.get_current_device()
    except Exception:  # no Triton, or no driver for this GPU: the kernels' own checks say why (dohnuts.ops._dispatch)
        return None
    with _LOCK:
        if index in _STARTED:
            return _STARTED[index]
        try:
            table = table if table is not None else matching_table()
            started = _start(index, device.type == "cuda", table, threads)
        except Exception as err:  # compiling ahead is only ever a head start: the launches compile as before
            print(f"dohnuts: the recorded kernels are not compiled ahead ({type(err).__name__}: {err}); they compile "
                  "at their first launch", file=sys.stderr)
            started = None
        _STARTED[index] = started
        return started


def _start(index: int, cuda: bool, table: dict | None, threads: int | None) -> Precompiled | None:
    entries = (table or {}).get("compiled") or []
    if not entries:
        return None
    if any(e["module"].startswith("fla.") for e in entries):
        # fla (and Triton): only where the table names fla's kernels
        from dohnuts.ops._fla import fla

        fla()  # fla's modules as dohnuts imports them (fla.ops and fla.modules deferred)
    work, unknown = [], []
    for entry in entries:
        try:
            fn = jit_function(entry["module"], entry["name"])
        except (ImportError, AttributeError, TypeError) as err:  # a kernel this version no longer has
            unknown.append(f"{entry['module']}.{entry['name']} ({type(err).__name__})")
            continue
        fn.device_caches[index]  # made here, on one thread (a dict Triton fills on first use)
        work.append((fn, entry["data"]))
    if unknown:
        print(f"dohnuts: {len(unknown)} recorded kernel(s) not found, compiled at first use: {', '.join(unknown[:3])}",
              file=sys.stderr)
    if not work:
        return None
    libdevice = local_libdevice(work[0][0], index)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = max(1, min(len(work), threads or cores))
    done = Precompiled(kernels=len(work), threads=n, started=time.perf_counter())
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dohnuts-compile")

    def compile_one(fn, data):
        if cuda:
            torch.cuda.set_device(index)  # a new thread starts on device 0: Triton compiles for the current one
        kernel = fn.preload(localised(data, table.get("libdevice"), libdevice))
        if cuda and kernel is not None:
            launcher_built(kernel)

    done.futures = [pool.submit(compile_one, fn, data) for fn, data in work]
    pool.shutdown(wait=False)
    return done


def launcher_built(kernel) -> None:
    """The compiled kernel's launcher built ahead of its first launch. On the H200's Triton (3.6) a
    launcher is a C stub per argument signature that the host's C compiler builds and Triton caches
    on disk; left to the launches, those builds sat in a fresh machine's first call, on its thread
    (docs/history/evolution.md M44). Building it here puts the stub in the disk cache, where the
    launch's own build finds it. Host work only: the binary is
    loaded onto the device at the launch, as before (a thread's module load could meet a graph
    capture on the caller's thread, which CUDA forbids)."""
    # Triton: on a GPU only (and in the tests that compile for one)
    from triton.runtime import driver

    src, metadata = getattr(kernel, "src", None), getattr(kernel, "metadata", None)
    if src is not None and metadata is not None:
        driver.active.launcher_cls(src, metadata)


@contextlib.contextmanager
def record(keep=lambda: True):
    """Inside: every kernel Triton compiles in this process (a launch's, not a preload's) is kept
    as a table entry — its module, name and serialised specialisation — when `keep()` says so at
    that moment (the maintainers' script leaves out the peers' launches). Yields
    `{"compiled": [...], "libdevice": path}`, filled as the kernels compile, each specialisation once."""
    # Triton: on a GPU only (and in the tests that compile for one)
    from triton import knobs

    made = {"compiled": [], "libdevice": None}
    seen = set()
    before = knobs.runtime.jit_post_compile_hook

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if before is not None:
            before(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                   already_compiled=already_compiled)
        data = compile["specialization_data"]
        if is_manual_warmup and threading.current_thread().name.startswith("dohnuts-compile"):
            return False  # a preload of ours, not a launch
        if data in seen or not keep():
            return False
        seen.add(data)
        jit = fn.jit_function
        made["compiled"].append({"module": jit.fn.__module__, "name": jit.fn.__name__, "data": data})
        libs = dict(compile.get("extern_libs") or ())
        made["libdevice"] = made["libdevice"] or libs.get("libdevice")
        return False

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield made
    finally:
        knobs.runtime.jit_post_compile_hook = before
