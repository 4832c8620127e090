"""The interleaved gate (`dohnuts-bench gate --against REV`): its statistics on simulated timings
(seeded: a machine whose speed drifts and jumps, processes that differ, noisy calls — never the
clock), the smallest detectable effect against a Monte Carlo of the rule it claims, the driver's
rounds with fake workers, and the command's refusals. What it catches on the real machine is
benchmarks/maintainers/gate_detection.py's to measure."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dohnuts.bench.analysis.compare import NO_CHANGE, SLOWER
from dohnuts.bench.analysis.rounds import judge_rounds, round_effect, smallest_detectable
from dohnuts.bench.measure.interleave import BASE, CANDIDATE, RoundsResult, first_side, run_rounds

ROOT = Path(__file__).resolve().parents[2]


# -- a simulated machine ----------------------------------------------------------------------------


def simulated_rounds(seed: int, *, factor: float, rounds: int = 10, calls: int = 50, call_noise: float = 0.10,
                     process_noise: float = 0.02, drift: float = 0.0) -> list[list[tuple[float, float]]]:
    """pairs[round] = [(base_ms, candidate_ms), ...] as the driver records them on a shared machine:
    calls taken in turns (the candidate first in odd rounds); every call's time is 20 ms × the
    candidate's `factor` (candidate only) × its process's offset (lognormal, `process_noise`, new
    each round) × the machine's speed now × lognormal call noise. The machine's speed follows load
    regimes (1×, 1.5×, 2.5×: another process comes and goes, switching with probability 0.05 a
    call) and, with `drift`, a trend: exp(drift × the share of the gate done) — drift = log 2 is a
    machine twice as slow at the end as at the start."""
    rng = np.random.default_rng(seed)
    regimes, regime = (1.0, 1.5, 2.5), 0
    total, t = 2 * rounds * calls, 0
    out = []
    for r in range(rounds):
        offset = np.exp(rng.normal(0.0, process_noise, 2))  # this round's two fresh processes
        order = (first_side(r), 1 - first_side(r))
        pairs = []
        for _ in range(calls):
            ms = {}
            for side in order:
                if rng.random() < 0.05:
                    regime = int(rng.integers(len(regimes)))
                speed = regimes[regime] * math.exp(drift * t / total)
                ms[side] = 20.0 * (factor if side == CANDIDATE else 1.0) * offset[side] * speed * math.exp(
                    rng.normal(0.0, call_noise))
                t += 1
            pairs.append((ms[BASE], ms[CANDIDATE]))
        out.append(pairs)
    return out


def verdict_of(pairs_by_round, **kw):
    return judge_rounds("w · dohnuts", [round_effect(p) for p in pairs_by_round], **kw)


def test_a_15_percent_slowdown_on_a_drifting_machine_is_flagged():
    rows = [verdict_of(simulated_rounds(seed, factor=1.15, drift=math.log(2))) for seed in range(20)]
    assert [r.verdict for r in rows] == [SLOWER] * 20
    assert all(1.10 < r.ratio < 1.20 and r.ci_low < 1.15 < r.ci_high for r in rows[:5]), rows[:5]


def test_unchanged_code_is_not_flagged():
    rows = [verdict_of(simulated_rounds(seed, factor=1.0)) for seed in range(20)]
    assert all(r.verdict == NO_CHANGE for r in rows), [r.ratio for r in rows]


def test_drift_alone_is_not_flagged():
    """The machine twice as slow at the end of the gate as at its start (and load regimes that
    come and go): paired calls cancel it. The same calls judged unpaired — the base's first half
    of the rounds against the candidate's second half — would read as a large slowdown."""
    for seed in range(20):
        pairs = simulated_rounds(seed, factor=1.0, drift=math.log(2))
        assert verdict_of(pairs).verdict == NO_CHANGE, seed
    early = [b for rnd in pairs[:5] for b, _ in rnd]
    late = [c for rnd in pairs[5:] for _, c in rnd]
    assert np.median(late) / np.median(early) > 1.25  # what the pairing removed


def test_the_interval_is_students_t_over_the_rounds_by_hand():
    from scipy import stats

    effects = [0.01, 0.05, -0.02, 0.04, 0.03]
    row = judge_rounds("x", effects, confidence=0.95, min_effect=0.05)
    d = np.array(effects)
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    assert row.ci_low == pytest.approx(math.exp(d.mean() - half), rel=1e-12)
    assert row.ci_high == pytest.approx(math.exp(d.mean() + half), rel=1e-12)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(confidence_level=0.95)  # scipy's own says the same
    assert (row.ci_low, row.ci_high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)), rel=1e-12)
    assert row.ratio == pytest.approx(math.exp(d.mean()), rel=1e-12)
    assert row.spread == pytest.approx(d.std(ddof=1), rel=1e-12) and row.verdict == NO_CHANGE
    # above 1 + min_effect with its whole interval: slower; the mirror image: faster
    assert judge_rounds("x", [0.20, 0.21, 0.19, 0.22], min_effect=0.05).verdict == SLOWER
    assert judge_rounds("x", [-0.20, -0.21, -0.19, -0.22], min_effect=0.05).verdict == "faster"
    # an interval that clears 1 but not 1 + min_effect claims nothing
    assert judge_rounds("x", [0.03, 0.031, 0.029, 0.03], min_effect=0.05).verdict == NO_CHANGE


def test_a_rounds_effect_is_the_median_of_its_pairs_log_ratios():
    pairs = [(10.0, 11.0), (20.0, 22.0), (10.0, 30.0), (10.0, 9.0), (40.0, 44.0)]
    assert round_effect(pairs) == pytest.approx(math.log(1.1), rel=1e-12)  # the 3× pair is one outlier
    for bad in ([], [(1.0, 0.0)], [(1.0, float("nan"))], [(1.0, 2.0, 3.0)]):
        with pytest.raises(ValueError):
            round_effect(bad)
    with pytest.raises(ValueError, match="at least 3 rounds"):
        judge_rounds("x", [0.1, 0.2])


def test_the_smallest_detectable_effect_is_caught_as_often_as_it_says():
    """A slowdown of exactly smallest_detectable(s, n) is flagged in ≈ 90 % of simulated gates
    whose round effects have spread s, and one of exactly min_effect in ≈ 2.5 % (the interval's
    lower tail): the documented rule, checked by Monte Carlo (seeded)."""
    rng = np.random.default_rng(7)
    s, n, m = 0.04, 10, 0.05
    mde = smallest_detectable(s, n, confidence=0.95, min_effect=m)
    assert m < mde < 0.15
    trials = 800

    def flagged(effect: float) -> float:
        d = rng.normal(math.log1p(effect), s, size=(trials, n))
        return float(np.mean([judge_rounds("x", row, min_effect=m).verdict == SLOWER for row in d]))

    assert 0.85 < flagged(mde) < 0.95  # a normal quantile in place of Student's would give ≈ 0.8
    assert flagged(m) < 0.05
    # no spread: anything beyond min_effect is seen; more spread or fewer rounds, a larger one
    assert smallest_detectable(0.0, n, confidence=0.95, min_effect=m) == m
    assert smallest_detectable(2 * s, n, confidence=0.95, min_effect=m) > mde
    assert smallest_detectable(s, 5, confidence=0.95, min_effect=m) > mde
    assert smallest_detectable(s, n, confidence=0.99, min_effect=m) > mde


# -- the driver's rounds, with fake workers ---------------------------------------------------------


class FakeWorker:
    """A side's worker without a process: its calls take `ms(side, round, i)`, every step logged."""

    def __init__(self, side: int, round_index: int, groups: list[str], events: list, ms, fail_at=None):
        self.side, self.r, self.groups, self.events, self.ms, self.fail_at = side, round_index, groups, events, ms, fail_at
        self.opened, self.stopped = None, False
        events.append(("start", side, round_index))

    def open(self, k):
        assert self.opened is None
        self.opened = k
        self.events.append(("open", self.side, k))

    def call(self, i):
        assert self.opened is not None and not self.stopped
        if self.fail_at == i:
            raise RuntimeError("worker died")
        self.events.append(("call", self.side, i))
        return self.ms(self.side, self.r, i)

    def close(self, k):
        assert self.opened == k
        self.opened = None
        self.events.append(("close", self.side, k))

    def cpu_seconds(self):
        return 0.0

    def stop(self):
        self.stopped = True
        self.events.append(("stop", self.side, self.r))


def test_the_rounds_take_turns_call_by_call_with_fresh_workers_each_round():
    events, workers = [], []
    groups = {BASE: ["a · dohnuts", "b · dohnuts", "old · dohnuts"], CANDIDATE: ["a · dohnuts", "b · dohnuts", "new"]}

    def start(side, r):
        workers.append(FakeWorker(side, r, groups[side], events, lambda s, rr, i: 100 * rr + 10 * s + i))
        return workers[-1]

    result = run_rounds(3, 4, start, measure_load=False)
    assert isinstance(result, RoundsResult)
    assert result.groups == ["a · dohnuts", "b · dohnuts"]
    assert result.only_in == {"base": ["old · dohnuts"], "candidate": ["new"]}
    assert result.first == ["base", "candidate", "base"]
    assert len(workers) == 6 and all(w.stopped for w in workers)  # two fresh processes a round, all stopped
    # pairs are (base, candidate) whatever order they ran in, one list a round
    assert result.pairs["a · dohnuts"][1] == [(100 + i, 110 + i) for i in range(4)]
    # the order: a round starts both, then per group opens both, alternates calls, closes both
    rounds = []
    for r in range(3):
        start_at = events.index(("start", BASE, r))
        end = events.index(("stop", CANDIDATE, r)) + 1
        rounds.append(events[start_at:end])
    for r, ev in enumerate(rounds):
        assert ev[:2] == [("start", BASE, r), ("start", CANDIDATE, r)]
        calls = [(side, i) for kind, side, i in ev if kind == "call"]
        first = first_side(r)
        per_group = [(first, i // 2) if i % 2 == 0 else (1 - first, i // 2) for i in range(8)]
        assert calls == per_group * 2  # strictly alternating, the same call index on both sides
        kinds = [kind for kind, *_ in ev]
        assert kinds == ["start", "start"] + (["open"] * 2 + ["call"] * 8 + ["close"] * 2) * 2 + ["stop"] * 2


def test_a_worker_that_fails_stops_the_round_and_every_worker():
    events, workers = [], []

    def start(side, r):
        workers.append(FakeWorker(side, r, ["a"], events, lambda s, rr, i: 1.0, fail_at=2 if side == CANDIDATE else None))
        return workers[-1]

    with pytest.raises(RuntimeError, match="worker died"):
        run_rounds(3, 4, start, measure_load=False)
    assert len(workers) == 2 and all(w.stopped for w in workers)


def test_the_gate_lines_name_each_verdict_and_the_smallest_detectable_slowdown():
    from dohnuts.bench.commands.gate import rounds_gate

    slowed = simulated_rounds(1, factor=1.15)
    same = simulated_rounds(2, factor=1.0)
    result = RoundsResult(["text · dohnuts", "text\x1b[31m · peer"], {"text · dohnuts": slowed, "text\x1b[31m · peer": same},
                          ["base"] * 10, [0.5] * 10, {"base": ["gone · dohnuts"]})
    ok, lines, rows = rounds_gate(result)
    assert not ok and [r.verdict for r in rows] == [SLOWER, NO_CHANGE]
    assert lines[0].startswith("text · dohnuts: ratio 1.1") and lines[0].endswith(": slower")
    assert "smallest detectable slowdown" in lines[0] and "over 10 rounds" in lines[0]
    assert "\x1b" not in lines[1] and "\\x1b[31m" in lines[1]  # a control character is shown, not obeyed
    assert lines[2] == "gone · dohnuts: only in the base (not gated)"
    assert rounds_gate(RoundsResult(["x"], {"x": same}, [], [], {}))[0]


# -- the command: trees, workers, refusals ----------------------------------------------------------


def _in_git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


SMALL = ("kind: text\ntargets: [dohnuts]\nmodel: tiny\nwarmup: 1\n"
         "shape: {requests: 1, questions: 2, seq_tokens: 64, candidates: 2, candidate_tokens: 2}\n")
needs_git = pytest.mark.skipif(not _in_git_checkout(), reason="not a git checkout: nothing to export")


@needs_git
def test_the_base_revision_is_exported_without_touching_the_repository(tmp_path):
    from dohnuts.bench.measure.interleave import export_revision, work_tree

    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    commit = export_revision(ROOT, "HEAD", tmp_path / "base")
    assert commit == subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
    assert (tmp_path / "base" / "dohnuts" / "__init__.py").is_file()
    assert (tmp_path / "base" / "dohnuts" / "bench" / "standard").is_symlink()  # links stay links
    assert subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                          text=True).stdout == worktrees
    assert work_tree(ROOT / "dohnuts" / "bench") == ROOT


def test_the_interleaved_gate_refuses_bad_input(tmp_path, capsys, monkeypatch):
    from dohnuts.bench.cli import main

    w = tmp_path / "w.yaml"
    w.write_text(SMALL)

    def refused(*argv) -> str:
        assert main(["gate", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    assert "--rounds" in refused("--against", "HEAD", str(w), "--rounds", "2")
    assert "--calls" in refused("--against", "HEAD", str(w), "--calls", "0")
    assert "--baseline" in refused("--against", "HEAD", str(w), "--baseline", str(w))
    assert "--against" in refused("w.yaml", "--rounds", "5")  # the interleaved gate's options alone
    assert "one CURRENT" in refused("a", "b")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: text\ntargets: [dohnuts]\nmodel: tiny\nshape: {questions: 0}\n")
    assert "bad.yaml" in refused("--against", "HEAD", str(bad))
    monkeypatch.chdir(tmp_path)  # not a git work tree
    assert "git work tree" in refused("--against", "HEAD", str(w))
    if _in_git_checkout():
        monkeypatch.chdir(ROOT)
        assert "--against" in refused("--against=-x", str(w))
        assert "names no commit" in refused("--against", "no-such-revision-xyz", str(w))


# Both sides as real processes, against HEAD, with the JSON it writes: tests/test_doc_examples.py's
# test_readme_regression_gate (the README's gate line at 3 rounds of 3 call pairs).


def test_a_side_that_cannot_start_leaves_no_worker_running():
    events, workers = [], []

    def start(side, r):
        if side == CANDIDATE:
            raise RuntimeError("cannot start")
        workers.append(FakeWorker(side, r, ["a"], events, lambda s, rr, i: 1.0))
        return workers[-1]

    with pytest.raises(RuntimeError, match="cannot start"):
        run_rounds(3, 4, start, measure_load=False)
    assert len(workers) == 1 and workers[0].stopped


@pytest.mark.slow(seconds=15)
def test_a_worker_that_cannot_time_its_side_says_why_in_one_line(tmp_path):
    """A real worker process: a workload file it cannot read, a tree whose dohnuts is not the
    one Python imports, and one whose built-in plugins come from elsewhere (a revision older than
    bench_plugins/ loads the installed ones) are each one DohnutsError naming the side."""
    import shutil
    import tomllib

    from dohnuts.bench.measure.interleave import Side, WorkerProcess
    from dohnuts.errors import DohnutsError

    with pytest.raises(DohnutsError, match=r"the base \(abc\) could not be timed: .*missing\.yaml"):
        WorkerProcess.start(Side("base", ROOT, "abc"), [tmp_path / "missing.yaml"], tmp_path / "s1", 0, threads=1,
                            trees=(ROOT,)).groups  # the ready line is read on first use
    w = tmp_path / "w.yaml"
    w.write_text(SMALL)
    elsewhere = tmp_path / "empty-tree"
    elsewhere.mkdir()
    with pytest.raises(DohnutsError, match="the candidate process imported dohnuts from .*, not from its tree"):
        WorkerProcess.start(Side("candidate", elsewhere, "work tree"), [w], tmp_path / "s2", 0, threads=1,
                            trees=(elsewhere,)).groups
    # its own dohnuts, the built-in plugins of this checkout (its pyproject maps them there)
    mixed = tmp_path / "mixed-tree"
    shutil.copytree(ROOT / "dohnuts", mixed / "dohnuts", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (mixed / "pyproject.toml").write_text(
        '[project]\nname = "dohnuts"\n[project.entry-points.dohnuts_bench]\n'
        + "".join(f'{k} = "{v}"\n' for k, v in project["entry-points"]["dohnuts_bench"].items())
        + f'[tool.setuptools]\npackage-dir = {{"dohnuts_bench_plugins" = "{ROOT / "bench_plugins"}"}}\n')
    with pytest.raises(DohnutsError, match=r"the base process imported the built-in plugins from .*, not from its"):
        WorkerProcess.start(Side("base", mixed, "abc"), [w], tmp_path / "s3", 0, threads=1, trees=(mixed,)).groups


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="this system cannot pin a process")
@pytest.mark.slow(seconds=10)
def test_a_worker_times_calls_on_the_cpu_it_is_given(tmp_path):
    """The protocol with a real worker of this tree: ready (its groups, pinned to the CPU asked
    for, as the gate pins both sides of a round), open, calls with positive wall times, close."""
    import os

    from dohnuts.bench.measure.interleave import Side, WorkerProcess

    w = tmp_path / "w.yaml"
    w.write_text(SMALL)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    worker = WorkerProcess.start(Side("candidate", ROOT, "work tree"), [w], tmp_path / "s", 0, threads=1,
                                 trees=(ROOT,), cpu=cpu)
    try:
        assert worker.groups == ["w · dohnuts"] and worker.cpus == [cpu]
        worker.open(0)
        assert all(worker.call(i) > 0 for i in range(3))
        worker.close(0)
    finally:
        worker.stop()
    assert worker.proc.returncode == 0
