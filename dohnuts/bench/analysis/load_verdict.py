"""Whether the machine's load explains a change: the one rule `compare`, `gate` and `history` apply.

Every record carries the `load` telemetry of its call (dohnuts_bench_plugins.analyzers.load):
`own_cores`, the share of a core this process got (1.0: a whole core), `others_cores`, the cores
other processes kept busy, and `cpus`. A run whose process waited for the CPU while other
processes held every core is slower by about the share of a core it lost — a fact about the
machine, not about the code. So a verdict between a slower run S and a faster run F (S is B for
"slower", A for "faster") is **explained by load** when all four hold:

    1. S's machine was saturated: S's process and the others kept all but half a core busy
       (own_S + others_S >= cpus - 0.5);
    2. S's process got less of a core: own_S <= 0.9 * own_F;
    3. the other processes took more: others_S >= others_F + 0.25 cores;
    4. the share lost accounts for the change: slowdown <= 2 * own_F / own_S (slowdown = the
       ratio of medians, or its inverse for "faster"). Put otherwise, the CPU time a call took
       (its wall time times its share of a core) at most doubled: a busy machine costs more than
       the share alone — another process on the same core's second hardware thread, caches,
       migrations. Measured on the 2-core machine, a run beside two CPU-bound processes against
       one without them: the share 0.75 → 0.32, the calls 3.88× (dohnuts) and 2.70× (transformers)
       slower, their CPU time 1.66× and 1.29× — a code change that does more work than that shows
       as more.

Then "slower" reads `slower, explained by load` (and "faster" `faster, explained by load`) with the
reason ("this process got 0.52 of a core in B against 0.98 in A; other processes kept 1.45 of 2
cores busy against 0.03"): not a regression — `compare` and `gate` exit 0 for it and say why, and
`history` does not flag it. Conditions 1 and 3 keep a change of the code from being excused: code
that waits longer (a slower GPU kernel, a sleep) also lowers this process's share of a core, but
leaves the other processes' use as it was and the machine not saturated. Equal loads, loads that
were not recorded, or a change larger than the lost share explains keep the plain verdict.

A record's load is the median over the telemetry samples of its call; a set of records' load the
median over the records. Records from before `own_cores` was recorded estimate the share as what
the others left of the machine, up to one core (a one-thread run): min(1, cpus - others), and the
reason says it is estimated.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dohnuts.bench.analysis.records import CallRecord
from dohnuts.bench.analysis.verdicts import FASTER, SLOWER

SLOWER_BY_LOAD = "slower, explained by load"
FASTER_BY_LOAD = "faster, explained by load"
EXPLAINED = (SLOWER_BY_LOAD, FASTER_BY_LOAD)

IDLE_LEFT = 0.5        # 1: at most this much of a core left idle on the slower run's machine
SHARE_DROP = 0.9       # 2: the slower run's share at most this fraction of the faster run's
OTHERS_RISE = 0.25     # 3: other processes used at least this many more cores in the slower run
CONTENTION_SLACK = 2.0  # 4: a call's CPU time may grow by this much under contention and still be explained


@dataclass(frozen=True)
class Load:
    """The load a set of records measured under (medians over the records)."""

    own_cores: float           # the share of a core this process got
    others_cores: float        # cores other processes kept busy
    cpus: int | None
    records: int
    own_estimated: bool = False  # own_cores not recorded: min(1, cpus - others)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def record_load(rec: CallRecord) -> tuple[float | None, float | None, int | None]:
    """(own_cores, others_cores, cpus) of one record: medians over its call's `load` samples
    (None where it has none)."""
    own, others, cpus = [], [], None
    for row in rec.telemetry:
        reading = row.get("load") if isinstance(row, dict) else None
        if not isinstance(reading, dict):
            continue
        if (o := _number(reading.get("others_cores"))) is not None:
            others.append(o)
        if (s := _number(reading.get("own_cores"))) is not None:
            own.append(s)
        if isinstance(reading.get("cpus"), int) and not isinstance(reading.get("cpus"), bool):
            cpus = reading["cpus"]
    return (statistics.median(own) if own else None, statistics.median(others) if others else None, cpus)


def load_of(per_record: list[tuple[float | None, float | None, int | None]]) -> Load | None:
    """The Load of records given as their `record_load` values; None where none recorded a load."""
    others = [o for _, o, _ in per_record if o is not None]
    if not others:
        return None
    own = [s for s, _, _ in per_record if s is not None]
    cpus = max((c for _, _, c in per_record if c is not None), default=None)
    others_median = statistics.median(others)
    if own:
        return Load(statistics.median(own), others_median, cpus, len(others))
    if cpus is None:
        return None
    return Load(max(0.0, min(1.0, cpus - others_median)), others_median, cpus, len(others), own_estimated=True)


def records_load(records: list[CallRecord]) -> Load | None:
    """The Load of a list of records."""
    return load_of([record_load(r) for r in records])


def explain(verdict: str, ratio: float | None, a: Load | None, b: Load | None, *, label_a: str = "A",
            label_b: str = "B") -> str | None:
    """The reason a `verdict` of B against A (ratio = median B / median A) is explained by the
    loads the two measured under (the rule of the module docstring), or None: the verdict stands."""
    if verdict not in (SLOWER, FASTER) or ratio is None or not ratio > 0 or a is None or b is None:
        return None
    slow, fast, slow_label, fast_label = (b, a, label_b, label_a) if verdict == SLOWER else (a, b, label_a, label_b)
    slowdown = ratio if verdict == SLOWER else 1.0 / ratio
    cpus = slow.cpus
    if cpus is None or slow.own_cores <= 0:
        return None
    saturated = slow.own_cores + slow.others_cores >= cpus - IDLE_LEFT
    starved = slow.own_cores <= SHARE_DROP * fast.own_cores
    crowded = slow.others_cores >= fast.others_cores + OTHERS_RISE
    accounted = slowdown <= CONTENTION_SLACK * fast.own_cores / slow.own_cores
    if not (saturated and starved and crowded and accounted):
        return None
    estimated = " (estimated: the records hold no own_cores)" if slow.own_estimated or fast.own_estimated else ""
    return (f"this process got {slow.own_cores:.2f} of a core in {slow_label} against {fast.own_cores:.2f} in "
            f"{fast_label}{estimated}; other processes kept {slow.others_cores:.2f} of {cpus} cores busy against "
            f"{fast.others_cores:.2f}")


def weigh(verdict: str, ratio: float | None, a: Load | None, b: Load | None, *, label_a: str = "A",
          label_b: str = "B") -> tuple[str, str | None]:
    """(verdict, reason): the verdict, or its `explained by load` form with the reason."""
    reason = explain(verdict, ratio, a, b, label_a=label_a, label_b=label_b)
    if reason is None:
        return verdict, None
    return (SLOWER_BY_LOAD if verdict == SLOWER else FASTER_BY_LOAD), reason
