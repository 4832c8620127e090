"""The interleaved gate's driver: a base revision and this work tree, timed in turns on this machine.

    base = export_revision(candidate, "main", scratch / "base")           # `git archive`, no checkout
    sides = [Side("base", base, commit), Side("candidate", candidate, "work tree")]
    result = run_rounds(10, 50, lambda side, r: WorkerProcess.start(sides[side], files, scratch, r, ...))

A round starts one process a side (dohnuts.bench.measure.gate_worker: the same driver file, each side's
own `dohnuts` first on PYTHONPATH, one Python environment for both), then for each workload ·
target both sides build and warm the target, and take turns, one call each: base, candidate,
base, candidate, ... (the candidate first in odd rounds). Every call but a round's first follows a
call of the other side, so each meets the same cold start (caches, branch predictors, the core
handed back by the scheduler); a pair (call j of each side, back to back) meets the same machine.
Only one side runs at a time; the other waits on its stdin. (Pairs in alternating order — B C C B
B C — were tried: the call that follows the other side's ran 5–10 % slower than the one that
follows its own, a bimodal noise on every pair.)

On a CPU both sides of a round run on the same CPU (`round_cpu`: the next one each round; a GPU
run is not pinned). Left to the scheduler, on a quiet 2-core machine each process tended to keep
a CPU of its own, and a CPU that ran slower (a neighbour on the host, invisible inside the
machine) made one side slower for a whole round: rounds at 0.78× and 1.18× of unchanged code, a
spread over rounds of 6–10 %, against 1–5 % with both on one CPU, whose pairs' log ratios were
also half as scattered (A/A runs of 10 rounds × 50 pairs; with one busy-looping process beside
them both ways gave 1–3 %).

The next round starts fresh processes: what one process pair does that another would not (memory
layout, a CPU, a load that stayed) is sampled again, and the rounds are the independent samples of
the statistics (dohnuts.bench.analysis.rounds). While the calls run, the load other processes put
on the machine is measured (the cores they kept busy: every CPU's busy time less this process's
and the two workers'), one value a round.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from dohnuts.bench.measure import gate_worker
from dohnuts.bench.measure.telemetry import BUSY_FIELDS
from dohnuts.bench.report.status import log
from dohnuts.errors import ConfigError, DohnutsError

BASE, CANDIDATE = 0, 1
SIDE_NAMES = ("base", "candidate")


@dataclass(frozen=True)
class Side:
    name: str        # "base" or "candidate"
    tree: Path       # the source tree whose `dohnuts` this side imports
    revision: str    # what the lines name it by (a commit, or "work tree")


class Worker(Protocol):
    """One side's process, as `run_rounds` drives it (WorkerProcess; a fake in the tests)."""

    groups: list[str]

    def open(self, k: int) -> None: ...
    def call(self, i: int) -> float: ...
    def close(self, k: int) -> None: ...
    def cpu_seconds(self) -> float: ...
    def stop(self) -> None: ...


@dataclass
class RoundsResult:
    """Every pair of calls of every round: pairs[group][round] = [(base_ms, candidate_ms), ...]."""

    groups: list[str]
    pairs: dict[str, list[list[tuple[float, float]]]]
    first: list[str]                                    # the side that started each round's first pair
    load: list[float | None]                            # other processes' cores, one value a round
    only_in: dict[str, list[str]] = field(default_factory=dict)  # side name → groups the other lacks


def round_cpu(round_index: int) -> int | None:
    """The CPU both sides of a round run on, this process's CPUs taken in turn (None where the
    system cannot pin a process)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[round_index % len(cpus)]


def first_side(round_index: int) -> int:
    """The side (BASE or CANDIDATE) that runs first in every pair of round `round_index`: the base in
    even rounds, the candidate in odd ones."""
    return round_index % 2


# ----------------------------------------------------------------------------------------------
# the rounds


class ExternalLoad:
    """Cores other processes kept busy while the calls ran: every CPU's busy time less the time of
    this process and of the workers, over the wall time measured (the load telemetry's rule, with
    the two workers counted as ours)."""

    def __init__(self):
        self.busy = self.wall = 0.0

    @staticmethod
    def _read(workers) -> tuple[float, float]:
        own, every = psutil.Process().cpu_times(), psutil.cpu_times()
        busy = sum(getattr(every, f, 0.0) for f in BUSY_FIELDS)
        return busy, own.user + own.system + sum(w.cpu_seconds() for w in workers)

    def measure(self, workers, fn) -> None:
        t0, (busy0, ours0) = time.monotonic(), self._read(workers)
        fn()
        t1, (busy1, ours1) = time.monotonic(), self._read(workers)
        self.busy += max(0.0, (busy1 - busy0) - (ours1 - ours0))
        self.wall += t1 - t0

    def cores(self) -> float | None:
        return self.busy / self.wall if self.wall > 0 else None


def run_rounds(rounds: int, calls: int, start: Callable[[int, int], Worker], *, measure_load: bool = True,
               names: tuple[str, str] = SIDE_NAMES) -> RoundsResult:
    """`rounds` rounds of `calls` pairs a workload · target; `start(side, round)` starts a side's
    worker (both are started before either is waited on, so they load in parallel)."""
    result: RoundsResult | None = None
    for r in range(rounds):
        workers: list[Worker] = []
        try:
            for side in (BASE, CANDIDATE):  # one by one: a side that cannot start leaves none running
                workers.append(start(side, r))
            groups = [g for g in workers[BASE].groups if g in workers[CANDIDATE].groups]
            if result is None:
                only = {names[s]: [g for g in workers[s].groups if g not in workers[1 - s].groups] for s in (0, 1)}
                result = RoundsResult(groups, {g: [] for g in groups}, [], [], {k: v for k, v in only.items() if v})
            elif groups != result.groups:
                raise DohnutsError(f"round {r + 1} found workloads · targets {groups}, round 1 {result.groups}")
            load = ExternalLoad()
            for g in groups:
                ks = [w.groups.index(g) for w in workers]
                for w, k in zip(workers, ks):
                    w.open(k)
                pairs: list[tuple[float, float]] = []

                def timed_pairs():
                    first = first_side(r)
                    for j in range(calls):
                        ms = {}
                        for s in (first, 1 - first):
                            ms[s] = workers[s].call(j)
                        pairs.append((ms[BASE], ms[CANDIDATE]))

                if measure_load:
                    load.measure(workers, timed_pairs)
                else:
                    timed_pairs()
                for w, k in zip(workers, ks):
                    w.close(k)
                result.pairs[g].append(pairs)
            result.first.append(names[first_side(r)])
            result.load.append(load.cores())
            log.info("round %d of %d done (%s first; other processes' load %s cores)", r + 1, rounds,
                     names[first_side(r)], "—" if load.cores() is None else f"{load.cores():.2f}")
        finally:
            for w in workers:
                w.stop()
    assert result is not None
    return result


# ----------------------------------------------------------------------------------------------
# the trees


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise DohnutsError(f"git cannot be run ({exc}): the interleaved gate exports the base revision with git")


def work_tree(cwd: Path) -> Path:
    """The git work tree holding `cwd`: the candidate, as it is (uncommitted changes included)."""
    out = _git(cwd, "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise ConfigError("is not inside a git work tree: run `gate --against` from the candidate's checkout",
                          source=str(cwd))
    tree = Path(out.stdout.strip())
    if not (tree / "dohnuts" / "__init__.py").is_file():
        raise ConfigError("holds no dohnuts package (dohnuts/__init__.py): not a dohnuts checkout", source=str(tree))
    return tree


def export_revision(tree: Path, rev: str, into: Path) -> str:
    """The files of commit `rev` of the repository holding `tree`, written into `into` (`git archive`:
    the repository and its work trees are not touched); returns the commit's hash."""
    if not rev or rev.startswith("-") or any(not c.isprintable() for c in rev):
        raise ConfigError(f"must name a revision (a branch, tag or commit), got {rev!r}", source="command line",
                          field="--against")
    out = _git(tree, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if out.returncode != 0:
        raise ConfigError(f"names no commit of the repository at {tree}: {rev!r}", source="command line",
                          field="--against")
    commit = out.stdout.strip()
    into.mkdir(parents=True)
    proc = subprocess.Popen(["git", "-C", str(tree), "archive", "--format=tar", commit], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(into, **safe)
    if proc.wait() != 0 or not (into / "dohnuts" / "__init__.py").is_file():
        raise DohnutsError(f"git archive of {commit[:12]} gave no dohnuts package "
                           f"({' '.join(proc.stderr.read().decode(errors='replace').split())[:300]})",
                           source=str(tree))
    return commit


# ----------------------------------------------------------------------------------------------
# a side's process


def _python_path(tree: Path, trees: tuple[Path, ...]) -> str:
    """PYTHONPATH for a side: its tree first, then the caller's entries that are neither tree."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() not in {t.resolve() for t in trees}]
    return os.pathsep.join([str(tree), *kept])


class WorkerProcess:
    """A gate_worker process of one side (module docstring of dohnuts.bench.measure.gate_worker)."""

    def __init__(self, side: Side, proc: subprocess.Popen, log_path: Path):
        self.side, self.proc, self.log_path = side, proc, log_path
        self._ps = psutil.Process(proc.pid)
        self._groups: list[str] | None = None
        self.cpus: list[int] | None = None

    @property
    def groups(self) -> list[str]:
        """The worker's workload · target groups, from its ready line (waited for on first use, so
        both sides of a round start up in parallel)."""
        if self._groups is None:
            ready = self._reply("ready")
            for line in ready.get("skipped") or ():
                log.info("%s: skipped %s", self.side.name, line)
            where = Path(str(ready.get("dohnuts"))).resolve()
            if not where.is_relative_to(self.side.tree.resolve()):
                self.stop()
                raise DohnutsError(f"the {self.side.name} process imported dohnuts from {where}, not from its "
                                   f"tree {self.side.tree} (an installed, non-editable dohnuts comes before "
                                   "PYTHONPATH?)")
            for plugin in ready.get("plugins") or ():
                if not Path(str(plugin)).resolve().is_relative_to(self.side.tree.resolve()):
                    self.stop()  # a revision from before bench_plugins/ reads the installed entry points
                    raise DohnutsError(f"the {self.side.name} process imported the built-in plugins from {plugin}, "
                                       f"not from its tree {self.side.tree} (a revision older than bench_plugins/ "
                                       "loads the installed ones: compare against a later revision)")
            self._groups, self.cpus = [str(g) for g in ready["ready"]], ready.get("cpus")
        return self._groups

    @classmethod
    def start(cls, side: Side, files: list[Path], scratch: Path, round_index: int, *, threads: int,
              trees: tuple[Path, ...], cpu: int | None = None) -> WorkerProcess:

        folder = scratch / f"round-{round_index + 1}" / side.name
        folder.mkdir(parents=True)
        env = dict(os.environ, PYTHONPATH=_python_path(side.tree, trees))
        boot = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        log_path = folder / "stderr.txt"
        with open(log_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", boot, gate_worker.__file__, str(threads), str(-1 if cpu is None else cpu),
                 str(folder / "inputs"),
                 *[str(f) for f in files]],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=folder, env=env, text=True, bufsize=1)
        return cls(side, proc, log_path)

    def _reply(self, key: str) -> dict:
        line = self.proc.stdout.readline()
        try:
            msg = json.loads(line) if line else {}
        except ValueError:
            msg = {}
        if key in msg:
            return msg
        self.stop()
        why = msg.get("error") or self._last_error_line() or "it ended without a word"
        raise DohnutsError(f"the {self.side.name} ({self.side.revision}) could not be timed: {why}")

    def _last_error_line(self) -> str | None:
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return None
        return " ".join(lines[-1].split())[:300] if lines else None

    def _send(self, obj: dict, key: str) -> dict:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # the process is gone: _reply says why
        return self._reply(key)

    def open(self, k: int) -> None:
        self._send({"open": k}, "opened")

    def call(self, i: int) -> float:
        return float(self._send({"call": i}, "ms")["ms"])

    def close(self, k: int) -> None:
        self._send({"close": k}, "closed")

    def cpu_seconds(self) -> float:
        try:
            t = self._ps.cpu_times()
        except psutil.Error:
            return 0.0
        return t.user + t.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def make_scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="dohnuts-gate-"))


def remove_scratch(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
