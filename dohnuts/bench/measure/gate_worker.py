"""One side of an interleaved gate: a process that times single calls when told to.

`dohnuts-bench gate --against REV` (dohnuts.bench.measure.interleave) starts this file twice a round, once
with the base revision's tree first on PYTHONPATH and once with the candidate's, and makes the two
take turns call by call. The same file drives both sides (the gate's own copy, run by path with
`runpy`): the protocol and the clock around a call are the same on both; everything it imports
from `dohnuts` — the workload kinds, the targets, the model — is the side's own.

Arguments: torch threads (a CPU run's), the CPU both sides of this round run on (-1: any; only a
run whose workloads are all on the CPU is pinned), a folder for generated inputs, the workload
files. Protocol: one JSON object a line. The worker first writes `{"ready": [group, ...], "dohnuts":
PATH, "skipped": [why, ...], "cpus": [...], "plugins": [PATH, ...]}` (its groups, "workload ·
target", in order; the CPUs it may run on; the files of its built-in workload kinds and targets);
then it answers each command on stdin:

    {"open": k}   build group k's target and warm it up    → {"opened": k}
    {"call": i}   time the open group's call i (wall ms)    → {"ms": 12.3}
    {"close": k}  release the target                        → {"closed": k}

and exits 0 at the end of stdin. On an error it writes `{"error": "one line"}` and exits 2. Its
stdout is the protocol alone: anything else a library prints goes to stderr.

Only the standard library is imported at the top: `dohnuts` is imported inside `main`, from the tree
the side was started with. What it uses of the harness is the plugin contract (docs/plugins.md)
and the run loop's helpers, so a base revision must be recent enough to have them
(`resolve_device`, `resolve_dtype`, `load_workload`, `WorkloadContext`; `_harness` finds them in
the bench's layout before and after its floor plan); one that lacks them is refused with that line.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path


def _timed_ms(target, call, device, timer_cls, synchronize) -> float:
    """Wall milliseconds of one call, the device synchronised on both sides (as the run's records)."""
    synchronize(device)
    t0 = time.perf_counter()
    target.run_call(call, timer_cls(device))
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def _harness():
    """(load_workload, resolve_device, resolve_dtype, synchronize) of the side's harness: where the
    bench's floor plan puts them (dohnuts.bench.measure), or, for a base revision from before it,
    where they were (dohnuts.bench.workload, .runner, .measure)."""
    try:
        # the side's own tree: imported once its PYTHONPATH is set (module docstring)
        from dohnuts.bench.measure.call import synchronize
        from dohnuts.bench.measure.runner import resolve_device, resolve_dtype
        from dohnuts.bench.measure.workload import load_workload
    except ImportError:
        # a revision from before the floor plan (issue 46): its own modules, where they were then
        from dohnuts.bench.measure import synchronize
        from dohnuts.bench.runner import resolve_device, resolve_dtype
        from dohnuts.bench.workload import load_workload
    return load_workload, resolve_device, resolve_dtype, synchronize


def _groups(files: list[str]):
    """(workload spec, target spec, registered target, device) of every group that can run here, in
    the order of the files and their targets (as `dohnuts-bench run` measures); the skipped lines;
    the files of the built-in `workloads` and `targets` plugins (the gate checks they are the side's)."""
    # the side's own tree: imported once its PYTHONPATH is set (module docstring)
    from dohnuts.bench.plugins import check_target_options, collect, plugin_manager

    load_workload, resolve_device, _, _ = _harness()
    pm = plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    groups, skipped = [], []
    for f in files:
        spec = load_workload(f, kinds, targets)
        check_target_options(spec, targets)
        device = resolve_device(spec)
        if device is None:
            skipped.append(f"{spec.name}: needs a CUDA GPU")
            continue
        for tspec in spec.targets:
            reason = targets[tspec.name].unavailable()
            if reason:
                skipped.append(f"{spec.name} · {tspec.label}: {reason}")
            else:
                groups.append((spec, tspec, targets[tspec.name], kinds[spec.kind], device))
    builtins = [pm.get_plugin(name) for name in ("workloads", "targets")]
    return groups, skipped, [os.path.realpath(b.__file__) for b in builtins if getattr(b, "__file__", None)]


def main(argv: list[str]) -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (a library's) must not break the protocol

    def say(obj) -> None:
        reply.write(json.dumps(obj) + "\n")

    threads, cpu, workdir, files = int(argv[0]), int(argv[1]), argv[2], argv[3:]
    try:
        # torch and the side's own tree: imported once its PYTHONPATH is set (module docstring)
        import torch

        import dohnuts
        from dohnuts.bench.contracts import WorkloadContext
        from dohnuts.model.build import resolve_source
        from dohnuts.runtime.timing import StageTimer
        from dohnuts.runtime.tokenizer import tokenizer_for

        _, _, resolve_dtype, synchronize = _harness()

        groups, skipped, plugins = _groups(files)
        if any(g[4].type == "cpu" for g in groups):
            torch.set_num_threads(threads)
        if cpu >= 0 and all(g[4].type == "cpu" for g in groups) and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})  # both sides of a round on one CPU (dohnuts.bench.measure.interleave: why)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        say({"ready": [f"{spec.name} · {tspec.label}" for spec, tspec, *_ in groups],
             "dohnuts": str(Path(dohnuts.__file__).resolve()), "skipped": skipped, "cpus": cpus,
             "plugins": plugins})
        target = calls = device = None
        for line in sys.stdin:
            cmd = json.loads(line)
            if "open" in cmd:
                spec, tspec, entry, kind, device = groups[cmd["open"]]
                dtype = resolve_dtype(spec, device)
                cfg, ckpt = resolve_source(spec.model)
                folder = Path(workdir) / f"group-{cmd['open']}"
                folder.mkdir(parents=True, exist_ok=True)
                calls = kind.calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, folder, random.Random(spec.seed)))
                target, _ = entry.build(spec, device, dtype, entry.options(tspec.options, source=spec.file))
                warmup = max(1, spec.warmup, len(calls) if kind.warmup_every_call(spec) else 0)
                for i in range(warmup):
                    target.run_call(calls[i % len(calls)], StageTimer(device))
                calls = calls[warmup % len(calls):] + calls[:warmup % len(calls)]  # go on where warm-up stopped
                say({"opened": cmd["open"]})
            elif "call" in cmd:
                say({"ms": _timed_ms(target, calls[cmd["call"] % len(calls)], device, StageTimer, synchronize)})
            elif "close" in cmd:
                target.close()
                target = None
                say({"closed": cmd["close"]})
        return 0
    except Exception as exc:  # one line back to the gate, which names the side and the revision
        say({"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:600]})
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
