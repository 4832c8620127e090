"""Comparing two runs honestly: is B faster, slower, or not distinguishable from A?

    comparison = compare_runs(read_records("runs/a/results.jsonl"), read_records("runs/b/results.jsonl"))
    SafeConsole().print(comparison_table(comparison))     # dohnuts.bench.report.terminal
    json.dumps(comparison_dict(comparison))

For every (workload, target) measured in both runs (steady-state calls only: a target's first
call, `phase: first-call`, is never part of the statistics), and for the whole call ("wall") and
each stage (`stage_ms`: device time where recorded, else host time), a row holds:

- the ratio median(B) / median(A) (> 1: B is slower);
- its bootstrap confidence interval: `scipy.stats.bootstrap` over the two samples resampled
  independently, statistic = ratio of the medians, percentile method by default (BCa on request;
  BCa's jackknife of a median is degenerate on small samples with repeated values), seeded per
  row from (seed, workload, target, stage), so the same inputs always give the same interval;
- the two-sided Mann-Whitney U p-value (`scipy.stats.mannwhitneyu`): a rank test, which holds its
  level whatever the distribution (latencies are skewed and have outliers);
- the verdict, decided by this rule (alpha = 1 - confidence, m = min_effect):

      "slower"  when the whole interval lies above 1 + m        and p < alpha
      "faster"  when the whole interval lies below 1 / (1 + m)  and p < alpha
      "no detectable change" otherwise
      "too few calls" when either run has fewer than 3 calls of that group/stage

  Where the two runs' loads explain a "slower" or "faster" (the machine was saturated by other
  processes in the slower run, whose process got less of a core: the rule and its thresholds are
  in dohnuts.bench.analysis.load_verdict), the verdict reads "slower, explained by load" (or
  "faster, ...") and the row's `load` says why; it is not a regression.

  Why: a bootstrap interval of medians is unreliable on a handful of calls (the resampled
  medians can only take the observed values, so 3 fully separated calls per run already give a
  tight interval, e.g. 2.3-3.5 for a p of 0.1); the rank test holds its level (exact p for small
  samples without ties), so it keeps the false-alarm rate at most alpha for two samples of one
  distribution; and requiring the interval
  to clear the band [1/(1+m), 1+m] (symmetric in log scale: 2 % slower mirrors 1/1.02 faster)
  means a verdict always claims a change of at least m that the data support at the stated
  confidence. "no detectable change" therefore reads: no change of m or more could be shown;
  the interval says how large a change these calls could still hide. With 3 calls per run the
  exact rank test cannot go below p = 0.1, so 3 calls never give a verdict at 95 %; 4 can.

A stage (not the whole call) whose medians differ by less than 1 % of the call's median wall time
gets no verdict whatever the statistics say: small stages shift by microseconds between
processes, which is real and immaterial.

Groups measured in only one run are listed as such (`only_in_a`, `only_in_b`), as are stages
recorded in only one run. Medians of zero give no ratio (both zero: no change).

`required_calls` and `spread_warning` use a normal approximation (documented there); `aa_noise`
compares the two interleaved halves of one run (records' `aa_half`): the noise budget of a run.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from dohnuts.bench.analysis.load_verdict import Load, load_of, record_load, weigh
from dohnuts.bench.analysis.quantiles import bootstrap_rng, quantiles
from dohnuts.bench.analysis.records import CallRecord, RecordError, stage_ms, target_label, where, workload_label
from dohnuts.bench.analysis.verdicts import FASTER, NO_CHANGE, SLOWER, TOO_FEW, UNDEFINED
from dohnuts.errors import DohnutsError

MIN_SHARE_OF_CALL = 0.01  # a stage verdict needs a change of at least this share of the call
MIN_CALLS = 3
DEFAULT_MIN_EFFECT = 0.02
DEFAULT_RESAMPLES = 9999
WALL = "wall"
RULE = ("slower: interval above 1+min_effect and rank-test p < 1-confidence; faster: interval below "
        "1/(1+min_effect) and p < 1-confidence; otherwise no detectable change; < 3 calls: too few calls")


@dataclass(frozen=True)
class StageComparison:
    """One (workload, target, stage) of two runs: B over A."""

    workload: str
    target: str
    stage: str                      # "wall" for the whole call
    n_a: int
    n_b: int
    median_a: float | None          # ms; None where the stage is missing from that run
    median_b: float | None
    ratio: float | None             # median_b / median_a
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str
    load: str | None = None         # why the loads explain the verdict (load_verdict), else None


@dataclass(frozen=True)
class Comparison:
    rows: tuple[StageComparison, ...]
    only_in_a: tuple[tuple[str, str], ...]
    only_in_b: tuple[tuple[str, str], ...]
    confidence: float
    min_effect: float
    resamples: int
    seed: int
    method: str
    label_a: str = "A"
    label_b: str = "B"
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def row(self, workload: str, target: str, stage: str = WALL) -> StageComparison:
        for r in self.rows:
            if (r.workload, r.target, r.stage) == (workload, target, stage):
                return r
        raise KeyError((workload, target, stage))

    @property
    def groups(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((r.workload, r.target) for r in self.rows))


@dataclass(frozen=True)
class NoiseBudget:
    """An A/A comparison of one run's two interleaved halves (half 1 over half 0)."""

    workload: str
    target: str
    rows: tuple[StageComparison, ...]   # "wall" first, then the stages

    def row(self, stage: str = WALL) -> StageComparison:
        for r in self.rows:
            if r.stage == stage:
                return r
        raise KeyError(stage)

    def halfwidth(self, stage: str = WALL) -> float | None:
        """The largest relative distance of the interval from 1: changes smaller than this cannot
        be told from this run's own noise (None: too few calls or no ratio)."""
        r = self.row(stage)
        if r.ci_low is None or r.ci_high is None:
            return None
        return max(r.ci_high - 1.0, 1.0 - r.ci_low)


# ----------------------------------------------------------------------------------------------
# samples


def _steady(rec: CallRecord) -> bool:
    return rec.phase == "steady"


def _key(rec: CallRecord) -> tuple[str, str]:
    return workload_label(rec), target_label(rec)


def workload_files(records: list[CallRecord]) -> dict[str, set[str]]:
    """{workload: the file hashes its steady-state records name} (records without one: none)."""
    out: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        if _steady(rec) and rec.workload.file_hash:
            out[workload_label(rec)].add(rec.workload.file_hash)
    return out


def changed_workloads(records_a: list[CallRecord], records_b: list[CallRecord]) -> list[str]:
    """One line per workload measured in both runs whose file changed between them (its hash):
    a difference there may be the workload's, not the code's."""
    fa, fb = workload_files(records_a), workload_files(records_b)
    return [f"{name}: its workload file changed between the runs (file hash {', '.join(sorted(fa[name]))} → "
            f"{', '.join(sorted(fb[name]))}): a difference may come from the workload, not the code"
            for name in fa if name in fb and fa[name] and fb[name] and fa[name] != fb[name]]


def changed_machines(records_a: list[CallRecord], records_b: list[CallRecord]) -> list[str]:
    """One line when the two runs measured on different devices (the records' device names): every
    difference then includes the machine's, not only the code's (`history` keeps machines apart,
    `gate` refuses another machine's baseline; compare says it and goes on)."""
    def names(records: list[CallRecord]) -> list[str]:
        return sorted({rec.device.name for rec in records if _steady(rec)})

    a, b = names(records_a), names(records_b)
    if not a or not b or a == b:
        return []
    return [(f"the runs measured on different machines (A: {', '.join(a)}; B: {', '.join(b)}): every "
             "difference includes the machine's, not only the code's")]


def steady_loads(records: list[CallRecord]) -> dict[tuple[str, str], Load]:
    """{(workload, target): load_verdict.Load} over the steady-state records that recorded a load."""
    per: dict[tuple[str, str], list] = defaultdict(list)
    for rec in records:
        if _steady(rec):
            per[_key(rec)].append(record_load(rec))
    return {k: load for k, v in per.items() if (load := load_of(v)) is not None}


def steady_samples(records: list[CallRecord]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(workload, target): {"wall": [...], stage: [...]}} over the steady-state records."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for rec in records:
        if not _steady(rec):
            continue
        groups = out.setdefault(_key(rec), defaultdict(list))
        groups[WALL].append(rec.wall_ms)
        for name, entry in rec.stages.items():
            groups[name].append(stage_ms(entry))
    return out


# ----------------------------------------------------------------------------------------------
# statistics of one pair of samples


def _ratio_of_medians(a, b, axis=-1):
    ma = np.median(a, axis=axis)
    mb = np.median(b, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(ma > 0, mb / np.where(ma > 0, ma, 1.0), np.where(mb > 0, np.inf, 1.0))
    return r


def _row_seed(seed: int, *names: str) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, zlib.crc32("\0".join(names).encode())]


def _interval(a: np.ndarray, b: np.ndarray, confidence: float, resamples: int, method: str,
              seed_seq: list[int]) -> tuple[float, float]:
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import stats

    if np.all(a == a[0]) and np.all(b == b[0]):        # no spread at all: the ratio is exact
        r = float(_ratio_of_medians(a, b))
        return r, r
    res = stats.bootstrap((a, b), _ratio_of_medians, n_resamples=resamples, vectorized=True, paired=False,
                          confidence_level=confidence, method=method, **bootstrap_rng(seed_seq))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    # resamples whose median of A is 0 give an infinite ratio; an undefined end is an open end
    lo = 0.0 if math.isnan(lo) else lo
    hi = math.inf if math.isnan(hi) else hi
    return lo, hi


def _p_value(a: np.ndarray, b: np.ndarray) -> float:
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import stats

    if np.all(a == a[0]) and np.all(b == a[0]):        # every value tied: nothing to rank
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def verdict(ci_low: float, ci_high: float, p_value: float, *, confidence: float, min_effect: float) -> str:
    """The rule of the module docstring."""
    alpha = 1.0 - confidence
    if p_value < alpha and ci_low > 1.0 + min_effect:
        return SLOWER
    if p_value < alpha and ci_high < 1.0 / (1.0 + min_effect):
        return FASTER
    return NO_CHANGE


def _compare_samples(workload: str, target: str, stage: str, a: list[float] | None, b: list[float] | None, *,
                     confidence: float, min_effect: float, resamples: int, seed: int,
                     method: str) -> StageComparison:
    xa = np.asarray(a if a else [], dtype=float)
    xb = np.asarray(b if b else [], dtype=float)
    med_a = float(np.median(xa)) if xa.size else None
    med_b = float(np.median(xb)) if xb.size else None
    base = {"workload": workload, "target": target, "stage": stage, "n_a": int(xa.size), "n_b": int(xb.size),
            "median_a": med_a, "median_b": med_b}
    if med_a is None or med_b is None:
        return StageComparison(**base, ratio=None, ci_low=None, ci_high=None, p_value=None,
                               verdict="only in A" if med_b is None else "only in B")
    if med_a == 0 or med_b == 0:
        both = med_a == 0 and med_b == 0
        return StageComparison(**base, ratio=1.0 if both else None, ci_low=None, ci_high=None, p_value=None,
                               verdict=NO_CHANGE if both else UNDEFINED)
    ratio = med_b / med_a
    if xa.size < MIN_CALLS or xb.size < MIN_CALLS:
        return StageComparison(**base, ratio=ratio, ci_low=None, ci_high=None, p_value=None, verdict=TOO_FEW)
    lo, hi = _interval(xa, xb, confidence, resamples, method, _row_seed(seed, workload, target, stage))
    p = _p_value(xa, xb)
    return StageComparison(**base, ratio=ratio, ci_low=lo, ci_high=hi, p_value=p,
                           verdict=verdict(lo, hi, p, confidence=confidence, min_effect=min_effect))


def _check_options(confidence: float, resamples: int, min_effect: float, method: str) -> None:
    if not 0.0 < confidence < 1.0:
        raise DohnutsError(f"must be between 0 and 1 (exclusive), got {confidence!r}", field="confidence")
    if int(resamples) < 100:
        raise DohnutsError(f"must be at least 100, got {resamples!r}", field="resamples")
    if not min_effect >= 0.0:
        raise DohnutsError(f"must be non-negative, got {min_effect!r}", field="min_effect")
    if method.lower() not in ("percentile", "bca"):
        raise DohnutsError(f"must be 'percentile' or 'BCa', got {method!r}", field="method")


# ----------------------------------------------------------------------------------------------
# public API


def compare_runs(records_a: list[CallRecord], records_b: list[CallRecord], *, confidence: float = 0.95,
                 resamples: int = DEFAULT_RESAMPLES, seed: int = 0, min_effect: float = DEFAULT_MIN_EFFECT,
                 method: str = "percentile", label_a: str = "A", label_b: str = "B") -> Comparison:
    """B against A per (workload, target) measured in both, for "wall" and every stage (rule:
    module docstring; the loads each run measured under weighed by load_verdict). Deterministic
    for a given seed. Warnings (one line each) say the runs measured on different machines
    (`changed_machines`), name workloads whose file changed between the runs
    (`changed_workloads`), then groups whose spread is too large to resolve a change of
    `min_effect` with the calls measured."""
    _check_options(confidence, resamples, min_effect, method)
    sa, sb = steady_samples(records_a), steady_samples(records_b)
    loads_a, loads_b = steady_loads(records_a), steady_loads(records_b)
    common = [k for k in sa if k in sb]
    rows, notes = [], changed_machines(records_a, records_b) + changed_workloads(records_a, records_b)
    for workload, target in common:
        stages = list(dict.fromkeys([WALL, *sa[(workload, target)], *sb[(workload, target)]]))
        wall_a = float(np.median(sa[(workload, target)][WALL]))
        for stage in stages:
            row = _compare_samples(workload, target, stage, sa[(workload, target)].get(stage),
                                   sb[(workload, target)].get(stage), confidence=confidence,
                                   min_effect=min_effect, resamples=int(resamples), seed=seed, method=method)
            if (stage != WALL and row.verdict in (SLOWER, FASTER)
                    and abs(row.median_b - row.median_a) < MIN_SHARE_OF_CALL * wall_a):
                # A shift of a tiny stage (a few µs between processes) is real but immaterial: a
                # stage verdict needs a change of at least 1 % of the whole call.
                row = dataclasses.replace(row, verdict=NO_CHANGE)
            weighed, reason = weigh(row.verdict, row.ratio, loads_a.get((workload, target)),
                                    loads_b.get((workload, target)))
            rows.append(dataclasses.replace(row, verdict=weighed, load=reason))
        if min_effect > 0:
            for label, s in ((label_a, sa), (label_b, sb)):
                walls = s[(workload, target)][WALL]
                if len(walls) < 2 or float(np.median(walls)) <= 0:
                    continue  # no spread to judge (the row says "too few calls" or has no ratio)
                w = spread_warning(walls, min_effect, confidence=confidence)
                if w:
                    notes.append(f"{workload} / {target} in {label}: {w}")
    return Comparison(rows=tuple(rows), only_in_a=tuple(k for k in sa if k not in sb),
                      only_in_b=tuple(k for k in sb if k not in sa), confidence=confidence, min_effect=min_effect,
                      resamples=int(resamples), seed=seed, method=method, label_a=label_a, label_b=label_b,
                      warnings=tuple(notes))


def compare_samples(name: str, a: list[float], b: list[float], *, confidence: float = 0.95,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0, min_effect: float = DEFAULT_MIN_EFFECT,
                    method: str = "percentile") -> StageComparison:
    """Two raw samples of one quantity (e.g. a pytest-benchmark's timings of two builds), B over A."""
    _check_options(confidence, resamples, min_effect, method)
    return _compare_samples(name, "", WALL, a, b, confidence=confidence, min_effect=min_effect,
                            resamples=int(resamples), seed=seed, method=method)


def _spread_parts(samples) -> tuple[np.ndarray, float, float]:
    x = np.asarray(list(samples), dtype=float)
    if x.size < 2:
        raise ValueError(f"needs at least 2 samples, got {x.size}")
    med = float(np.median(x))
    if med <= 0:
        raise ValueError(f"needs a positive median, got {med}")
    p10, p90 = quantiles(x, [0.1, 0.9])   # the reports' quantile (dohnuts.bench.analysis.quantiles)
    return x, med, p90 - p10


def _median_halfwidth_factor(confidence: float) -> float:
    """Relative half-width of the median's interval = factor * sigma / (median * sqrt(n))."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return z * math.sqrt(math.pi / 2)


_P10_P90_SIGMAS = 2 * NormalDist().inv_cdf(0.9)   # p90 - p10 of a normal distribution, in sigmas (2.563)


def required_calls(samples, rel_halfwidth: float = 0.05, confidence: float = 0.95) -> int:
    """Calls needed for the median's confidence interval to have about ±rel_halfwidth (relative).

    Normal approximation on the median's standard error, SE(median) = sqrt(pi/2) * sigma / sqrt(n)
    (exact asymptotically for normal data), with sigma estimated robustly from the observed
    p10-p90 range, sigma = (p90 - p10) / 2.563 (a single outlier does not dominate it):

        n = ceil((z * sqrt(pi/2) * sigma / (rel_halfwidth * median))**2),  z = z_(1+confidence)/2

    and never fewer than 3 (the fewest calls a comparison gives a verdict on).
    """
    if not rel_halfwidth > 0:
        raise ValueError(f"rel_halfwidth must be positive, got {rel_halfwidth!r}")
    _, med, p10_p90 = _spread_parts(samples)
    sigma = p10_p90 / _P10_P90_SIGMAS
    n = (_median_halfwidth_factor(confidence) * sigma / (rel_halfwidth * med)) ** 2
    return max(MIN_CALLS, math.ceil(n - 1e-9))


def median_halfwidth(samples, confidence: float = 0.95) -> float:
    """The relative half-width these samples give the median (same approximation as required_calls)."""
    x, med, p10_p90 = _spread_parts(samples)
    return _median_halfwidth_factor(confidence) * (p10_p90 / _P10_P90_SIGMAS) / (med * math.sqrt(x.size))


def spread_warning(samples, claimed_precision: float, *, confidence: float = 0.95) -> str | None:
    """One line when the spread, (p90 - p10) / median, is too large for the calls measured to
    give the median within ±claimed_precision (relative) at `confidence`; else None."""
    x, med, p10_p90 = _spread_parts(samples)
    half = median_halfwidth(x, confidence)
    if half <= claimed_precision:
        return None
    need = required_calls(x, claimed_precision, confidence)
    return (f"spread {100 * p10_p90 / med:,.0f}% (p90 − p10 over the median): {x.size} calls give the median to "
            f"about ±{100 * half:.1f}%, not ±{100 * claimed_precision:g}%; about {need:,} calls needed")


def aa_noise(records: list[CallRecord], group: tuple[str, str], *, confidence: float = 0.95,
             resamples: int = DEFAULT_RESAMPLES, seed: int = 0, method: str = "percentile") -> NoiseBudget:
    """The noise budget of a run: its steady-state calls of `group` (workload, target), measured as
    two interleaved halves (each record's integer `aa_half`, 0 or 1), compared half 1 over half 0
    like two runs. The interval around 1 is what the run's own noise allows; `halfwidth()` is the
    smallest relative change it can tell from noise."""
    _check_options(confidence, resamples, 0.0, method)
    halves: list[list[CallRecord]] = [[], []]
    found = False
    for rec in records:
        if not _steady(rec) or _key(rec) != tuple(group):
            continue
        found = True
        if rec.aa_half is None:  # (0 or 1 otherwise: the record's type)
            raise RecordError("is missing: the run was not measured as two interleaved halves", source=where(rec),
                              field="aa_half")
        halves[rec.aa_half].append(rec)
    if not found:
        raise DohnutsError(f"no steady-state records of workload {group[0]!r}, target {group[1]!r}")
    comp = compare_runs(halves[0], halves[1], confidence=confidence, resamples=resamples, seed=seed,
                        min_effect=0.0, method=method, label_a="half 0", label_b="half 1")
    if not comp.rows:
        empty = 0 if not halves[0] else 1
        raise DohnutsError(f"half {empty} of workload {group[0]!r}, target {group[1]!r} has no records",
                           field="aa_half")
    return NoiseBudget(workload=str(group[0]), target=str(group[1]), rows=comp.rows)
