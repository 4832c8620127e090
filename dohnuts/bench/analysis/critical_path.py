"""Critical path of consecutive calls over a stage dependency graph with resources.

Model. A call is a set of stages; stage s runs for d_s on one resource (the CPU preparing
batches, the host→device copy engine, the compute stream, the device→host copy engine, the
serializing host thread). Calls i = 0, 1, 2, ... repeat the same stages. Constraints:

- dependencies (before, after, lag): `after` of call i + lag starts only when `before` of call i
  has finished. lag 0 = within one call (the chain prepare → h2d → vision → prefix → suffix →
  head → d2h → serialize); lag k >= 1 = across calls (buffer reuse: with k buffers, the h2d of
  call i + k waits until call i's compute has consumed its inputs);
- resources: each resource runs its stages one at a time, in call order and, within a call,
  in stage order. A resource with capacity c (e.g. c CPU workers) is modelled as round robin:
  call i + c waits for call i on it.

Each stage starts as early as these allow (ASAP). The finish times then obey the max-plus
recursion f_s(i) = d_s + max over predecessors (u, lag) of f_u(i − lag), and the time per call
in steady state — the *critical path* of the pipeline — is

    T_cp = lim_{K→∞} makespan(K) / K = max over cycles Γ of the template graph of
           (Σ_{s ∈ Γ} d_s) / (Σ_{edges ∈ Γ} lag)

(the maximum cycle ratio of a timed event graph; every cycle has a positive lag because the
lag-0 edges follow the stage order). We enumerate the simple cycles: the graphs have ~10 nodes.

Bounds, for any durations:
  max_s d_s <= T_cp: each resource's order edges form a cycle of lag c through its stages,
      so T_cp >= load(r)/c(r) >= d_s / c(r); with capacity 1 (the default), T_cp >= d_s.
  T_cp <= Σ_s d_s: a simple cycle visits each stage at most once and has lag >= 1.
With one-unit resources this is the `max <= critical path <= sum` the report relies on; the
single-call latency (one call alone, no overlap across calls) is the longest lag-0 path, which
is the plain sum for a chain. For the default graph (a chain, buffers >= 2) T_cp reduces to
the busiest resource's load per call; the general machinery is what lets a plugin describe
another pipeline (more buffers, parallel stages, several workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

# The canonical stages in call order and the resource each occupies (cost.stage_costs' names plus
# the host-side stages the harness times; `shared` is prefix + suffix run as one pass).
STAGE_RESOURCES = (
    ("prepare", "cpu"), ("h2d", "h2d"), ("vision", "compute"), ("shared", "compute"), ("prefix", "compute"),
    ("suffix", "compute"), ("forward", "compute"), ("head", "compute"), ("backward", "compute"), ("allreduce", "interconnect"),
    ("optimizer", "compute"),
    ("d2h", "d2h"), ("serialize", "serialize"),
)


@dataclass(frozen=True)
class Dependency:
    """`after` of call i + lag waits for `before` of call i."""

    before: str
    after: str
    lag: int = 0


@dataclass(frozen=True)
class CallGraph:
    stages: tuple[tuple[str, str], ...]  # (stage, resource) in within-call order
    dependencies: tuple[Dependency, ...] = ()
    capacity: Mapping[str, int] = field(default_factory=dict)  # resource → parallel units (default 1)

    def __post_init__(self) -> None:
        names = [s for s, _ in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate stage names in {names}")
        index = {s: i for i, s in enumerate(names)}
        for d in self.dependencies:
            if d.before not in index or d.after not in index:
                raise ValueError(f"dependency {d} names an unknown stage (stages: {names})")
            if d.lag < 0 or (d.lag == 0 and index[d.before] >= index[d.after]):
                raise ValueError(f"dependency {d}: a within-call (lag 0) dependency must follow the stage order")
        for r, c in self.capacity.items():
            if not isinstance(c, int) or c < 1:
                raise ValueError(f"capacity of resource {r!r} must be a positive integer, got {c!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.stages)

    def edges(self) -> list[tuple[int, int, int]]:
        """(before, after, lag) over stage indices: dependencies plus each resource's order."""
        index = {s: i for i, s in enumerate(self.names)}
        out = [(index[d.before], index[d.after], d.lag) for d in self.dependencies]
        by_resource: dict[str, list[int]] = {}
        for i, (_, r) in enumerate(self.stages):
            by_resource.setdefault(r, []).append(i)
        for r, idx in by_resource.items():
            out += [(a, b, 0) for a, b in zip(idx, idx[1:])]
            out.append((idx[-1], idx[0], self.capacity.get(r, 1)))  # next use, `capacity` calls later
        return out

    def _durations(self, durations: Mapping[str, float]) -> list[float]:
        out = [float(durations.get(s, 0.0)) for s in self.names]
        if any(d < 0 for d in out):
            raise ValueError(f"negative stage duration in {dict(durations)}")
        return out

    def latency(self, durations: Mapping[str, float]) -> float:
        """One call alone: the longest path over within-call (lag 0) edges."""
        d = self._durations(durations)
        finish = [0.0] * len(d)
        preds = [[a for a, b, lag in self.edges() if b == i and lag == 0] for i in range(len(d))]
        for i in range(len(d)):  # stage order is a topological order of lag-0 edges
            finish[i] = d[i] + max((finish[p] for p in preds[i]), default=0.0)
        return max(finish, default=0.0)

    def critical_cycle(self, durations: Mapping[str, float]) -> tuple[float, tuple[str, ...]]:
        """(T_cp, the stages of a cycle that sets it): the steady-state time per call."""
        d = self._durations(durations)
        lag: dict[tuple[int, int], int] = {}
        for a, b, k in self.edges():  # parallel edges: the smallest lag gives the largest ratio
            lag[(a, b)] = min(k, lag.get((a, b), k))
        succ: dict[int, list[int]] = {}
        for a, b in lag:
            succ.setdefault(a, []).append(b)
        best, best_cycle = 0.0, ()
        for cycle in _simple_cycles(len(d), succ):
            lags = sum(lag[(a, b)] for a, b in zip(cycle, cycle[1:] + cycle[:1]))
            ratio = sum(d[i] for i in cycle) / lags
            if ratio > best or not best_cycle:
                best, best_cycle = ratio, tuple(self.names[i] for i in cycle)
        return best, best_cycle

    def critical_path(self, durations: Mapping[str, float]) -> float:
        return self.critical_cycle(durations)[0]

    def makespan(self, durations: Mapping[str, float], calls: int) -> float:
        """Finish time of `calls` consecutive calls, every stage ASAP (a check of critical_path)."""
        d = self._durations(durations)
        edges = self.edges()
        preds = [[(a, k) for a, b, k in edges if b == i] for i in range(len(d))]
        finish: list[list[float]] = []
        for c in range(calls):
            row = [0.0] * len(d)
            for i in range(len(d)):
                start = 0.0
                for a, k in preds[i]:
                    if c - k >= 0:
                        start = max(start, (row if k == 0 else finish[c - k])[a])
                row[i] = start + d[i]
            finish.append(row)
        return max(finish[-1], default=0.0) if finish else 0.0


def _simple_cycles(n: int, succ: Mapping[int, list[int]]) -> Iterable[list[int]]:
    """Every simple cycle once, rooted at its smallest node (DFS; fine for small graphs)."""
    for start in range(n):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in succ.get(node, ()):
                if nxt == start:
                    yield path
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + [nxt]))


def default_call_graph(stage_names: Iterable[str], *, buffers: int = 2,
                       extra_resources: Mapping[str, str] | None = None,
                       capacity: Mapping[str, int] | None = None) -> CallGraph:
    """The dohnuts pipeline over the stages present in a call (the transfer pipeline of dohnuts.runtime.pipeline).

    Canonical stages follow STAGE_RESOURCES' order in one chain. Other stages are host work
    (resource `cpu`, right after `prepare`) unless `extra_resources` places them. `buffers`
    double-buffers the inputs: h2d of call i + buffers waits for the last compute stage of call
    i, and prepare of call i + buffers for the h2d of call i (pinned host buffers)."""
    if buffers < 1:
        raise ValueError(f"buffers must be >= 1, got {buffers}")
    present = list(dict.fromkeys(stage_names))
    canonical = dict(STAGE_RESOURCES)
    extra = dict(extra_resources or {})
    order = [s for s, _ in STAGE_RESOURCES]
    head = [s for s in order[:1] if s in present]
    others = [s for s in present if s not in canonical]
    tail = [s for s in order[1:] if s in present]
    ordered = head + others + tail
    stages = tuple((s, canonical.get(s) or extra.get(s, "cpu")) for s in ordered)
    deps = [Dependency(a, b) for a, b in zip(ordered, ordered[1:])]
    computes = [s for s, r in stages if r == "compute"]
    if "h2d" in present and computes:
        deps.append(Dependency(computes[-1], "h2d", buffers))
    if "prepare" in present and "h2d" in present:
        deps.append(Dependency("h2d", "prepare", buffers))
    return CallGraph(stages, tuple(deps), dict(capacity or {}))
