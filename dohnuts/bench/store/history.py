"""History across commits, per machine: the series of runs in the store and the level shifts in each.

A **series** is one machine (run.json `measured.machine.id`, dohnuts.bench.measure.machine_id; derived for
runs made before it was recorded), device, model (preset or checkpoint), precision and hwspec, and
one workload, target and stage: runs of another machine are another series, so no change is ever
flagged between a 2-core CPU and an H200. A run's point is the median of its steady-state calls
(the stage's, or the whole call's for `wall`).

**Level shifts over the whole series**, after asv's step detection (asv/step_detect.py): the
logarithms y of the points are fitted by the piecewise-constant function that minimises the L1
distance plus a penalty gamma a level (asv's Potts problem, solved exactly by dynamic programming
as asv's `solve_potts` does: `level_starts`; series hold tens of runs, not thousands, so neither
asv's approximations and compiled helper nor a library such as ruptures are needed). gamma comes
from measured noise where asv picks it by an information criterion: the noise between runs (below)
as the mean absolute deviation of one run's median, b = sigma * sqrt(2 / pi), times 2 ln(n) —
twice the Schwarz penalty of a level's two parameters in the L1 (Laplace) likelihood. On 16 runs
scattered by 5 % that makes a spurious level in 5 % of series; a 10 % shift between 8 and 8 runs
scattered by 3 % is found at its place in 83 % (asv's own criterion, tried first, missed it in 2
of 8 seeds). Where that noise is not measured (a series of 2 or 3 runs, none of them of one clean
revision), every run is its own level: each run is judged against the one before.

Each place a new level starts is a candidate shift, judged by the statistics of `dohnuts-bench
compare`: the calls of the runs of the level before against those of the level after (ratio of
medians, bootstrap interval, rank test: dohnuts.bench.analysis.compare), with a smallest change
given a verdict that comes from measured noise: the larger of `min_effect` and the noise between
runs, which no run's own calls show (on a shared machine unchanged code moves by more between
processes than within one; a run's median scatters by its calls' noise and by that). Where the
series cannot measure it (2 or 3 runs, none of one clean revision), the A/A noise of the two runs
beside the shift stands in for it, as it did when history compared neighbours (each run measures
its calls as two interleaved halves: the distance of that half-over-half interval from 1 is what
the run cannot tell from noise). The noise between runs is measured from the series itself,
robustly to its shifts: sigma = 1.4826 * median |y[i+1] - y[i]| / sqrt(2) over the log medians (at least 4 runs);
where consecutive runs measured one clean revision (the same commit, no uncommitted change), their
differences are that noise by definition — the code did not change — and measure it directly (the
same estimate over those pairs alone; the larger of the two is used). A shift between levels of
k1 and k2 runs must exceed z * sqrt(pi / 2) * sigma * sqrt(1/k1 + 1/k2) (the interval of the
difference of two medians of k1 and k2 runs), z taken at the stated confidence over the n - 1
places a shift could have been found (Bonferroni). Finally the loads the two levels' calls
measured under are weighed by dohnuts.bench.analysis.load_verdict: a shift the lost share of a
core explains reads "slower, explained by load" and is not flagged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np
from rich.text import Text

from dohnuts.bench.analysis.compare import DEFAULT_MIN_EFFECT, FASTER, SLOWER, WALL, compare_samples
from dohnuts.bench.analysis.hwspec import BUILTIN_DIR, load_hwspec
from dohnuts.bench.analysis.load_verdict import EXPLAINED, load_of, weigh
from dohnuts.bench.analysis.records import stage_ms
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.bench.store.run_store import RunStore
from dohnuts.errors import DohnutsError
from dohnuts.schema import json_safe
from dohnuts.schema.values import printable

MIN_RUNS_FOR_NOISE = 4   # runs a series needs before the noise between its runs is measured
STEP_RESAMPLES = 1999    # bootstrap resamples of a shift's interval
AA_RESAMPLES = 999       # and of a run's A/A noise


@dataclass(frozen=True)
class SeriesKey:
    machine: str
    device: str
    model: str
    precision: str
    hwspec: str
    workload: str
    target: str
    stage: str

    @property
    def context(self) -> str:
        """What makes runs comparable: machine · device · model · precision · hwspec."""
        return " · ".join((self.machine, self.device, self.model, self.precision, self.hwspec))


@dataclass(frozen=True)
class Point:
    run_id: str
    started: str | None
    revision: str | None
    dirty: bool | None
    calls: int
    median_ms: float
    own_cores: float | None = None     # the share of a core this process got (median over its calls)
    others_cores: float | None = None  # cores other processes kept busy
    file_hash: str | None = None       # the workload file's hash in this run (None: not recorded)


@dataclass(frozen=True)
class Step:
    """A level shift: the runs `at` onwards (`runs_after` of them) against the `runs_before` before."""

    at: int
    runs_before: int
    runs_after: int
    median_before: float
    median_after: float
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str
    min_effect: float            # the smallest change given a verdict: measured noise decides it
    load: str | None = None      # why the loads explain it (load_verdict), else None

    @property
    def flagged(self) -> bool:
        return self.verdict in (SLOWER, FASTER)


@dataclass(frozen=True)
class Series:
    key: SeriesKey
    points: tuple[Point, ...]
    steps: tuple[Step, ...] = ()        # every place a new level starts, flagged or not
    noise: float | None = None           # how far runs scatter (relative, one sigma), where measured

    @property
    def workload(self) -> str:
        return self.key.workload

    @property
    def target(self) -> str:
        return self.key.target

    @property
    def stage(self) -> str:
        return self.key.stage

    @property
    def file_changes(self) -> list[int]:
        """The runs whose workload file differs from the run's before (both recorded): a level
        there may be the workload's, not the code's."""
        return [i for i in range(1, len(self.points)) if self.points[i].file_hash and self.points[i - 1].file_hash
                and self.points[i].file_hash != self.points[i - 1].file_hash]

    @property
    def changes(self) -> list[Step]:
        """The flagged level shifts."""
        return [s for s in self.steps if s.flagged]

    @property
    def shown(self) -> list[Step]:
        """The shifts a reader is told about: flagged, or explained by load."""
        return [s for s in self.steps if s.flagged or s.verdict in EXPLAINED]


# ----------------------------------------------------------------------------------------------
# level shifts


def level_starts(y, gamma: float) -> list[int]:
    """The indices where a new level starts in the piecewise-constant fit of `y` minimising the L1
    distance plus `gamma` a level (asv's Potts problem, exact: every segment's L1 cost about its
    median, then the best partition by dynamic programming — O(n^3), milliseconds for a hundred
    runs). gamma 0: every change of value starts a level."""
    y = np.asarray(y, dtype=float)
    n = y.size
    if n < 2:
        return []
    cost = np.full((n, n), np.inf)  # cost[l, r]: y[l..r] about its median
    for lo in range(n):
        for hi in range(lo, n):
            seg = y[lo:hi + 1]
            cost[lo, hi] = np.abs(seg - np.median(seg)).sum()
    best = np.empty(n + 1)  # best[r + 1]: y[0..r] fitted, with the penalty of its levels
    best[0] = -gamma        # (the first level costs nothing)
    start = np.zeros(n, dtype=int)  # where the last level of that fit starts
    for r in range(n):
        candidates = best[:r + 1] + gamma + cost[:r + 1, r]
        start[r] = int(np.argmin(candidates))
        best[r + 1] = candidates[start[r]]
    starts, r = [], n - 1
    while r >= 0 and start[r] > 0:
        starts.append(int(start[r]))
        r = start[r] - 1
    return sorted(starts)


def level_penalty(sigma: float | None, n: int) -> float:
    """gamma of `level_starts` for a series of n runs whose noise between runs is sigma (log units):
    2 ln(n) mean absolute deviations of one run (the module docstring); 0 where not measured."""
    return 0.0 if not sigma else 2.0 * math.log(n) * sigma * math.sqrt(2.0 / math.pi)


def run_noise(medians: list[float]) -> float | None:
    """The noise between runs in log units (robust to level shifts: the median absolute difference
    of consecutive runs), or None below MIN_RUNS_FOR_NOISE runs."""
    if len(medians) < MIN_RUNS_FOR_NOISE:
        return None
    y = np.log(np.asarray(medians, dtype=float))
    return float(1.4826 * np.median(np.abs(np.diff(y))) / math.sqrt(2.0))


def same_revision_noise(points: list[Point]) -> float | None:
    """The noise between runs in log units measured by consecutive runs of one clean revision (the
    same commit, neither with uncommitted changes), or None where the series holds none."""
    steps = [abs(math.log(b.median_ms / a.median_ms)) for a, b in zip(points, points[1:])
             if a.revision and a.revision == b.revision and a.dirty is False and b.dirty is False]
    return float(1.4826 * np.median(steps) / math.sqrt(2.0)) if steps else None


def between_runs_effect(sigma: float | None, runs_before: int, runs_after: int, places: int,
                        confidence: float) -> float:
    """The smallest relative shift between levels of these many runs that the noise between runs
    (`run_noise`) does not explain at `confidence` over `places` candidate places (0: not measured)."""
    if not sigma:
        return 0.0
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / (2.0 * max(1, places)))
    return math.expm1(z * math.sqrt(math.pi / 2) * sigma * math.sqrt(1 / runs_before + 1 / runs_after))


def aa_halfwidth(samples: list[float], halves: list[int | None], confidence: float) -> float | None:
    """A run's own A/A noise: its two interleaved halves compared (dohnuts.bench.analysis.compare
    aa_noise's halfwidth, for one stage); None where they cannot be told (few calls, no halves)."""
    h0 = [x for x, h in zip(samples, halves) if h == 0]
    h1 = [x for x, h in zip(samples, halves) if h == 1]
    if len(h0) < 3 or len(h1) < 3:
        return None
    c = compare_samples("A/A", h0, h1, confidence=confidence, min_effect=0.0, resamples=AA_RESAMPLES)
    if c.ci_low is None or c.ci_high is None:
        return None
    return max(c.ci_high - 1.0, 1.0 - c.ci_low)


# ----------------------------------------------------------------------------------------------
# the store's series


@dataclass
class _Run:
    point: dict
    samples: list[float] = field(default_factory=list)
    halves: list[int | None] = field(default_factory=list)
    loads: list[tuple] = field(default_factory=list)


def hwspec_name(value) -> str:
    """A run's hwspec as one name: a file's stem (`results/hwspecs/h200.yaml` → h200), a built-in
    spec's `name` as its file's stem (`NVIDIA H200` → h200, as early runs recorded it), `none`."""
    if not value:
        return "none"
    text = str(value)
    if "/" in text or text.endswith((".yaml", ".yml")):
        return Path(text).stem
    return _builtin_names().get(text, text)


@functools.cache
def _builtin_names() -> dict[str, str]:
    """Each built-in hwspec's `name` → its file's stem (read once)."""
    names = {}
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        try:
            names[load_hwspec(path).name] = path.stem
        except DohnutsError:  # a broken built-in spec only loses its alias here
            continue
    return names


def stored_stage_ms(call: dict, stage: str) -> float | None:
    """The time of `stage` in a steady call's stored record (a `CallRecord`, typed when the store
    read it; device time where recorded), or None where the call has no such stage."""
    entry = call["record"].stages.get(stage)
    return stage_ms(entry) if entry is not None else None


def history(store, *, machine: str | None = None, device: str | None = None, model: str | None = None,
            precision: str | None = None, hwspec: str | None = None, workload: str | None = None,
            target: str | None = None, stage: str = WALL, confidence: float = 0.95,
            min_effect: float = DEFAULT_MIN_EFFECT) -> list[Series]:
    """Every series in `store` (filtered by each part of its key), oldest run first, with its level
    shifts judged (the module docstring)."""
    calls = store.steady_calls(workload=workload, target=target, machine=machine, with_record=stage != WALL)
    runs: dict[SeriesKey, dict[str, _Run]] = {}
    for c in calls:
        key = SeriesKey(c["machine"] or "unknown", c["device"] or "?", c["model"] or "?", c["precision"] or "?",
                        hwspec_name(c["hwspec"]), c["workload"], c["target"], stage)
        if any(want is not None and want != have for want, have in ((device, key.device), (model, key.model),
                                                                    (precision, key.precision),
                                                                    (hwspec, key.hwspec))):
            continue
        if stage == WALL:
            value = c["wall_ms"]
        else:
            value = stored_stage_ms(c, stage)
        if value is None:
            continue
        run = runs.setdefault(key, {}).setdefault(c["run_id"], _Run(c))
        run.samples.append(float(value))
        run.halves.append(c["aa_half"])
        run.loads.append((c["own_cores"], c["others_cores"], c["cpus"]))
    out = [_series(key, list(by_run.values()), confidence, min_effect) for key, by_run in runs.items()]
    return sorted(out, key=lambda s: (s.key.machine, s.key.device, s.key.model, s.key.precision, s.key.hwspec,
                                      s.key.workload, s.key.target))


def _series(key: SeriesKey, runs: list[_Run], confidence: float, min_effect: float) -> Series:
    points = []
    for r in runs:
        load = load_of(r.loads)
        c = r.point
        points.append(Point(run_id=str(c["run_id"]), started=c["started"], revision=c["revision"],
                            dirty=None if c["dirty"] is None else bool(c["dirty"]), calls=len(r.samples),
                            median_ms=float(np.median(r.samples)),
                            own_cores=None if load is None or load.own_estimated else load.own_cores,
                            others_cores=None if load is None else load.others_cores, file_hash=c.get("file_hash")))
    medians = [p.median_ms for p in points]
    positive = all(m > 0 for m in medians)
    measured = [run_noise(medians), same_revision_noise(points)] if positive else []
    sigma = max((x for x in measured if x is not None), default=None)
    starts = level_starts(np.log(medians), level_penalty(sigma, len(medians))) if positive else []
    bounds = [0, *starts, len(runs)]
    steps = []
    for j, at in enumerate(starts):
        before, after = runs[bounds[j]:at], runs[at:bounds[j + 2]]
        if sigma is not None:
            noise = [between_runs_effect(sigma, len(before), len(after), len(runs) - 1, confidence)]
        else:  # not measured: each run's own A/A noise, as for two runs compared
            noise = [x for r in (runs[at - 1], runs[at]) if (x := aa_halfwidth(r.samples, r.halves, confidence))]
        threshold = max([min_effect] + noise)
        pooled_before = [x for r in before for x in r.samples]
        pooled_after = [x for r in after for x in r.samples]
        c = compare_samples(f"{key.workload} · {key.target} · {key.stage}", pooled_before, pooled_after,
                            confidence=confidence, min_effect=threshold, resamples=STEP_RESAMPLES)
        verdict, reason = weigh(c.verdict, c.ratio, load_of([x for r in before for x in r.loads]),
                                load_of([x for r in after for x in r.loads]), label_a="the runs before",
                                label_b="the runs after")
        steps.append(Step(at=at, runs_before=len(before), runs_after=len(after), median_before=c.median_a,
                          median_after=c.median_b, ratio=c.ratio, ci_low=c.ci_low, ci_high=c.ci_high,
                          p_value=c.p_value, verdict=verdict, min_effect=threshold, load=reason))
    return Series(key, tuple(points), tuple(steps), None if sigma is None else math.expm1(sigma))


# ----------------------------------------------------------------------------------------------
# rendering


def _revision(p: Point) -> str:
    return (p.revision or "?")[:10] + ("+dirty" if p.dirty else "")


def _step_words(s: Step, p: Point) -> str:
    interval = "" if s.ci_low is None else f" ({s.ci_low:.3f}–{s.ci_high:.3f})"
    return (f"{s.verdict} {s.ratio:.3f}×{interval} at {_revision(p)} {p.run_id} ({s.runs_before} → "
            f"{s.runs_after} runs, ≥ {s.min_effect:.1%})" + (f": {s.load}" if s.load else ""))


def history_lines(series: list[Series]) -> list:
    """The compact view: a heading a machine · device · model · precision · hwspec, under it one
    line a workload · target · stage with its runs, its first and last level and its flagged level
    shifts (and those the load explains)."""
    out, context = [], None
    for s in series:
        if s.key.context != context:
            context = s.key.context
            out.append(Text(printable(context), style="bold"))
        first, last = s.points[0], s.points[-1]
        when = sorted({p.started[:10] for p in s.points if p.started})
        span = "" if not when else f" ({when[0]})" if len(when) == 1 else f" ({when[0]} → {when[-1]})"
        medians = (f"{first.median_ms:.4g} ms" if len(s.points) == 1
                   else f"{first.median_ms:.4g} → {last.median_ms:.4g} ms")
        line = Text(f"  {printable(s.key.workload)} · {printable(s.key.target)} · {printable(s.key.stage)}: "
                    f"{len(s.points)} run{'s' if len(s.points) != 1 else ''}{span}, {medians}")
        if s.noise is not None:
            line.append(f"; runs scatter ±{s.noise:.1%}")
        shown = s.shown
        if not shown:
            line.append("; no level shift" if len(s.points) > 1 else "")
        for step in shown:
            colour = "yellow" if step.verdict in EXPLAINED else ("red" if step.verdict == SLOWER else "green")
            line.append("; ")
            line.append(printable(_step_words(step, s.points[step.at])), style=colour)
        for i in s.file_changes:
            line.append("; ")
            line.append(printable(f"the workload's file changed at {_revision(s.points[i])} {s.points[i].run_id}"),
                        style="yellow")
        out.append(line)
    return out


def history_tables(series: list[Series]) -> list:
    """The full view: one table a series (fitting any console width), a row a run — its median and
    load — and, at the first run of each new level, the shift's verdict against the level before."""
    out = []
    for s in series:
        cols = [Col("run", "left"), Col("revision", "left"), Col("calls"), Col("median ms"),
                Col("this process / others, cores"), Col("level before → after ms"), Col("ratio"), Col("interval"),
                Col("level shift", "left", wrap=True)]
        title = f"{s.key.context} · {s.key.workload} · {s.key.target} · {s.key.stage}"
        if s.noise is not None:
            title += f" (runs scatter ±{s.noise:.1%})"
        t = FitTable(printable(title), cols)
        at = {step.at: step for step in s.steps}
        for i, p in enumerate(s.points):
            load = "—" if p.others_cores is None else (
                f"{'?' if p.own_cores is None else f'{p.own_cores:.2f}'} / {p.others_cores:.2f}")
            cells = [printable(p.run_id), printable(_revision(p)), str(p.calls), f"{p.median_ms:.3f}", load]
            step = at.get(i)
            changed = Text("the workload's file changed here", style="yellow") if i in s.file_changes else ""
            if step is None:
                t.add_row(*cells, "", "", "", changed)
                continue
            colour = "yellow" if step.verdict in EXPLAINED else {SLOWER: "red", FASTER: "green"}.get(step.verdict, "")
            verdict = Text(f"{step.verdict} (≥ {step.min_effect:.1%}; {step.runs_before} → {step.runs_after} runs)"
                           + (f": {step.load}" if step.load else "")
                           + ("; the workload's file changed here" if changed else ""), style=colour)
            t.add_row(*cells, f"{step.median_before:.3f} → {step.median_after:.3f}",
                      "" if step.ratio is None else f"{step.ratio:.3f}×",
                      "" if step.ci_low is None else f"{step.ci_low:.3f}–{step.ci_high:.3f}", verdict)
        out.append(t)
    return out


def history_dict(series: list[Series], stage: str) -> dict:
    """The series as plain JSON: each one's key, points and level shifts."""
    return json_safe({"stage": stage, "series": [
        asdict(s.key) | {"noise_between_runs": s.noise, "points": [asdict(p) for p in s.points],
                         "steps": [asdict(st) | {"flagged": st.flagged, "run_id": s.points[st.at].run_id}
                                   for st in s.steps]}
        for s in series]})


def trends_for(store_path: str | Path | None, summary: dict, run_id: str | None = None) -> list[Series]:
    """The store's history of the workloads and targets of `summary` (steady calls, wall time): the
    series this run belongs to (its machine, device, model, precision and hwspec), or, for a run the
    store does not hold, every machine's series of those workloads (report.html's trend charts)."""
    if store_path is None or not Path(store_path).is_file():
        return []
    wanted = {(r["workload"], r["target"]) for r in summary.get("summary", []) if "·" not in r["target"]}
    with RunStore(store_path, read_only=True) as store:  # read only: the page never changes the store
        series = [s for s in history(store) if (s.workload, s.target) in wanted]
    mine = [s for s in series if any(p.run_id == run_id for p in s.points)]
    return mine or series

