"""The headline that opens a run's report: per workload, how fast dohnuts is against its peer and
how close it comes to the measured bound — the answer before the detail.

A row per workload and comparison, from the steady calls the analysis keeps (valid, per call):

- dohnuts (`records.is_product`: the dohnuts target as users run it): its median call, its
  whole-call efficiency (critical-path bound / wall) against the `measured` basis where the
  analysis has one (else its first basis, named in the cell) — never above 100 %: a call faster
  than its bound reads bound-suspect with the reason (bounds.shown_efficiency) — and its verdict
  against the target fraction (80 %);
- against its peer, a target that is not dohnuts (transformers, transformers+peft, ...): the ratio
  of medians peer / dohnuts (above 1: dohnuts is faster) with its bootstrap 95 % interval and the
  verdict of `dohnuts-bench compare`'s rule (dohnuts.bench.analysis.compare: two targets of one run
  in place of two runs), and the peer's fast paths as its records say (`extra.peer`,
  records.PeerPaths: which implementation ran each path, a reference fallback marked FALLBACK;
  "fast paths not recorded" where its records do not say);
- against each measurement-only variant of dohnuts (unshared, eager: what sharing or the CUDA
  graphs are worth), labelled (measurement-only);
- "no peer" where the workload measured none (the image kinds): dohnuts' efficiency alone.

A peer whose calls left its GPU idle over a quarter of the time while its process held a whole core of the host is
named host-bound under the table (`host_bound`): its time, and the speed-up against it, follow the
machine's CPU, as transformers + PEFT's training update does from one H200 lease to the next
(docs/history/evolution.md M37).

On a CPU the headline also says what such a run can and cannot show: it is read first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.text import Text

from dohnuts.bench.analysis.compare import compare_samples
from dohnuts.bench.analysis.load_verdict import record_load
from dohnuts.bench.analysis.machine import BUSY_OTHERS, MachineConditions, machine_conditions
from dohnuts.bench.analysis.records import (
    CallRecord, PeerPaths, group_key, is_dohnuts, is_product, peer_paths, per_call_records, valid_records,
)
from dohnuts.bench.analysis.render import VERDICT_STYLE, Col, FitTable, efficiency_cell
from dohnuts.schema import median, printable

PEER, MEASUREMENT_ONLY, NO_PEER = "peer", "measurement-only", "no peer"
HOST_BOUND_GPU_BUSY = 75.0  # % of the time the GPU ran a kernel (the median over the group's samples) ...
HOST_BOUND_OWN_CORES = 0.9  # ... while the process kept at least this much of a core busy
PREFERRED_BASIS = "measured"
FALLBACK = "FALLBACK"
NOT_RECORDED = "fast paths not recorded"

CPU_RUN_SHOWS = (
    "A CPU run shows: every workload running end to end through the harness; where a call's time "
    "goes, stage by stage; numbers measured side by side in one run (dohnuts beside transformers on the "
    "same weights, the shared prefix against no sharing, a warm image cache against a cold one); each "
    "stage against this CPU's own ceilings, measured at the start of the run.")
CPU_RUN_CANNOT = (
    "It cannot show: anything about a GPU (the fused fla and Triton kernels, CUDA graphs, the transfer "
    "pipeline and the 2b sizes run only there; a CPU runs every op's plain-torch reference path, and its "
    "h2d / d2h stages copy nothing: host and device memory are one); what the tiny preset's random "
    "weights answer (its times are of the harness and the reference paths, not of a trained model); and "
    "times on a shared machine move with the other processes (their load: \"This run's machine\", at the "
    "end).")


@dataclass(frozen=True)
class Standing:
    """One target's steady calls against the bound."""

    target: str
    calls: int
    wall_ms: float  # median
    basis: str | None  # the bound's basis; None: the run has no bound (no hwspec, no ceilings)
    efficiency: float | None  # whole call, never above 1 (None where `suspect` or no bound)
    verdict: str | None  # meets / misses / bound-suspect against the target fraction
    suspect: str | None = None  # why no efficiency is shown (bounds.shown_efficiency)


@dataclass(frozen=True)
class Speedup:
    """The other target's median over dohnuts' (above 1: dohnuts is faster), with the bootstrap
    interval and the verdict of compare's rule, read for dohnuts."""

    ratio: float | None
    low: float | None
    high: float | None
    verdict: str


@dataclass(frozen=True)
class HeadlineRow:
    workload: str
    dohnuts: Standing | None  # None: the workload did not measure dohnuts itself
    role: str  # PEER, MEASUREMENT_ONLY or NO_PEER
    against: Standing | None = None
    speedup: Speedup | None = None
    peer: PeerPaths | None = None  # role PEER: its fast paths (None: not recorded)


@dataclass(frozen=True)
class CpuScope:
    device: str
    threads: int | None
    cpus: int | None
    shows: str = CPU_RUN_SHOWS
    cannot: str = CPU_RUN_CANNOT


@dataclass(frozen=True)
class Headline:
    rows: tuple[HeadlineRow, ...]
    target_fraction: float
    cpu: CpuScope | None = None  # a CPU run: what it can and cannot show
    # the machine's conditions that weaken every number above (dohnuts.bench.analysis.machine)
    caveats: tuple[str, ...] = ()
    host_bound: tuple[str, ...] = ()  # one sentence for each host-bound peer (module docstring)

    def to_dict(self) -> dict:
        return {"target_fraction": self.target_fraction, "preferred_basis": PREFERRED_BASIS,
                "rows": [_row_dict(r) for r in self.rows],
                "cpu": dataclasses.asdict(self.cpu) if self.cpu else None,
                "peer_messages": peer_messages(self), "caveats": list(self.caveats),
                "host_bound": list(self.host_bound)}


def peer_dict(p: PeerPaths | None) -> dict | None:
    """`extra.peer` as summary.json carries it: as recorded, plus each path's status (FALLBACK
    where the library ran its reference code) and the words the reports show."""
    if p is None:
        return None
    status = {path: FALLBACK if path in p.fallbacks else "ok" for path in p.paths}
    status |= {path: FALLBACK for path in p.fallbacks}
    return {"library": p.library, "version": p.version, "paths": dict(p.paths), "fallbacks": list(p.fallbacks),
            "messages": list(p.messages), "status": status, "shown": paths_words(p)}


def paths_words(p: PeerPaths) -> str:
    """"transformers 5.17.0: delta_rule fla · conv causal_conv1d FALLBACK · ..." (printable)."""
    items = [f"{path} {impl or '—'}" + (f" {FALLBACK}" if path in p.fallbacks else "") for path, impl in p.paths.items()]
    items += [f"{path} {FALLBACK}" for path in p.fallbacks if path not in p.paths]
    library = p.library + (f" {p.version}" if p.version else "")
    return printable(f"{library}: " + (" · ".join(items) if items else "no paths recorded"))


def _row_dict(r: HeadlineRow) -> dict:
    return {"workload": r.workload, "role": r.role,
            "dohnuts": dataclasses.asdict(r.dohnuts) if r.dohnuts else None,
            "against": dataclasses.asdict(r.against) if r.against else None,
            "speedup": dataclasses.asdict(r.speedup) if r.speedup else None,
            "peer": peer_dict(r.peer),
            "fast_paths": fast_paths_words(r)}


def fast_paths_words(r: HeadlineRow) -> str:
    if r.role != PEER:
        return "—"
    return paths_words(r.peer) if r.peer else NOT_RECORDED


def peer_messages(h: Headline) -> list[str]:
    """Each distinct fallback warning the peers' libraries gave, once, with who said it."""
    out: dict[str, None] = {}
    for r in h.rows:
        if r.peer:
            for m in r.peer.messages:
                out[printable(f"{r.peer.library}: {m}")] = None
    return list(out)


def _standing(target: str, recs: list[CallRecord], group) -> Standing:
    wall = median(r.wall_ms for r in recs)
    if group is None or not group.bases:
        return Standing(target, len(recs), wall, None, None, None)
    basis = PREFERRED_BASIS if PREFERRED_BASIS in group.bases else group.bases[0]
    c = group.call
    return Standing(target, len(recs), wall, basis, c.efficiency.get(basis), c.verdict.get(basis),
                    c.suspect.get(basis))


def _percent(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 100 else None


def host_bound(workload: str, target: str, recs: list[CallRecord]) -> str | None:
    """The sentence naming `target` host-bound on `workload` (module docstring), or None: its GPU's
    utilisation (any telemetry reading's `gpu_util_percent`) and its process's share of a core
    (the `load` readings), medians over its calls' samples; None where either was not recorded."""
    util = [u for r in recs for row in r.telemetry if isinstance(row, dict) for reading in row.values()
            if isinstance(reading, dict) and (u := _percent(reading.get("gpu_util_percent"))) is not None]
    own = [o for o in (record_load(r)[0] for r in recs) if o is not None]
    if not util or not own:
        return None
    busy, cores = median(util), median(own)
    if busy >= HOST_BOUND_GPU_BUSY or cores < HOST_BOUND_OWN_CORES:
        return None
    return printable(f"{target} on {workload} kept its GPU {busy:.0f} % busy while its process kept "
                     f"{cores:.2f} cores of the host busy: host-bound — its time, and the speed-up against "
                     "it, follow this machine's CPU")


SPEEDUP_WORDS = {"slower": "dohnuts faster", "faster": "dohnuts slower", "no detectable change": "no detectable difference"}


def speedup(workload: str, other: str, dohnuts_walls: list[float], other_walls: list[float]) -> Speedup:
    """compare's statistics with A = dohnuts and B = the other target: B / A is the speed-up."""
    c = compare_samples(f"{workload}\0{other}", dohnuts_walls, other_walls)
    return Speedup(c.ratio, c.ci_low, c.ci_high, SPEEDUP_WORDS.get(c.verdict, c.verdict))


def build_headline(records: list[CallRecord], analysis=None, measured: dict | None = None) -> Headline:
    """The headline of `records` (a run's, as read) and their `analysis` (None: no bounds)."""
    steady, _ = valid_records([r for r in per_call_records(records) if r.phase == "steady"])
    groups: dict[tuple[str, str], list[CallRecord]] = {}
    for rec in steady:
        groups.setdefault(group_key(rec), []).append(rec)
    analysed = {(g.workload, g.target): g for g in analysis.groups} if analysis is not None else {}
    standing = {k: _standing(k[1], recs, analysed.get(k)) for k, recs in groups.items()}
    rows: list[HeadlineRow] = []
    for workload in dict.fromkeys(w for w, _ in groups):
        mine = {t: recs for (w, t), recs in groups.items() if w == workload}
        products = [t for t, recs in mine.items() if is_product(recs[0])]
        peers = [t for t, recs in mine.items() if not is_dohnuts(recs[0])]
        variants = [t for t, recs in mine.items() if is_dohnuts(recs[0]) and not is_product(recs[0])]
        for product in products or [None]:
            base = standing[(workload, product)] if product else None
            walls = [r.wall_ms for r in mine[product]] if product else []
            if not peers and base is not None:
                rows.append(HeadlineRow(workload, base, NO_PEER))
            for role, others in ((PEER, peers), (MEASUREMENT_ONLY, variants)):
                for other in others:
                    recs = mine[other]
                    peer = next((p for p in map(peer_paths, recs) if p is not None), None) if role == PEER else None
                    ratio = speedup(workload, other, walls, [r.wall_ms for r in recs]) if walls else None
                    rows.append(HeadlineRow(workload, base, role, standing[(workload, other)], ratio, peer))
    m = machine_conditions(records, measured)
    cpu = CpuScope(printable(m.device), m.threads, m.cpus) if m.device_type == "cpu" else None
    fraction = analysis.hwspec.target_fraction if analysis is not None else 0.8
    bound = (host_bound(r.workload, r.against.target, groups[(r.workload, r.against.target)])
             for r in rows if r.role == PEER and r.against is not None)
    return Headline(tuple(rows), fraction, cpu, caveats(m), tuple(dict.fromkeys(b for b in bound if b)))


def caveats(m: MachineConditions) -> tuple[str, ...]:
    """One line for each condition of the machine that weakens the headline's numbers (the detail
    is in "This run's machine", at the end of the report)."""
    out = []
    busy = [g.others_cores_median for g in m.groups if g.others_cores_median > BUSY_OTHERS]
    if busy:
        out.append(f"other processes kept up to {max(busy):.2f} cores busy while {len(busy)} of the "
                   f"{len(m.groups)} workload · target groups were measured: their times are slowed and spread, "
                   "their intervals wide")
    if m.unstable:
        out.append(f"measured ceiling(s) {', '.join(m.unstable)} moved between their repeats: the bounds and "
                   "efficiencies they set are uncertain by as much")
    return tuple(out)


# -- the text report ------------------------------------------------------------------------------

def efficiency_words(s: Standing | None) -> Text:
    """A standing's efficiency: a percentage (its basis named when not the measured one), or
    bound-suspect, or "no bound"."""
    if s is None:
        return Text("—")
    if s.basis is None:
        return Text("no bound")
    cell = efficiency_cell(s.efficiency, s.suspect)
    return cell + Text(f" ({s.basis})") if s.basis != PREFERRED_BASIS else cell


def speedup_words(sp: Speedup | None) -> str:
    """"1.26× (1.05–1.50)": the other's median over dohnuts', with its 95 % interval."""
    if sp is None or sp.ratio is None:
        return "—"
    if sp.low is None or sp.high is None:
        return f"{sp.ratio:.2f}×"
    return f"{sp.ratio:.2f}× ({sp.low:.2f}–{sp.high:.2f})"


def headline_table(h: Headline) -> FitTable:
    """The table: a row per workload and comparison (module docstring), dohnuts' own cells said
    once a workload."""
    t = FitTable(f"Headline: dohnuts against its peer and against the measured bound (target {h.target_fraction:.0%})",
                 [Col("workload", "left", wrap=True), Col("against", "left", wrap=True), Col("dohnuts\nms"),
                  Col("efficiency\n(measured bound)"), Col(f"{h.target_fraction:.0%}\ntarget", "center"),
                  Col("its\nms"), Col("its\nefficiency"), Col("dohnuts speed-up\n(95 % interval)"),
                  Col("difference", "left", wrap=True), Col("peer's fast paths", "left", wrap=True)],
                 keys=2, groups=[(2, 3, 4), (5, 6), (7, 8), (9,)])
    previous = None
    for r in h.rows:
        d, a = r.dohnuts, r.against
        verdict = Text("—") if d is None or d.verdict is None else Text(d.verdict, style=VERDICT_STYLE.get(d.verdict, ""))
        mine = ["not measured" if d is None else f"{d.wall_ms:.2f}", efficiency_words(d), verdict]
        if (r.workload, d) == previous:  # dohnuts' cells are said once a workload
            mine = ["″", "″", "″"]
        previous = (r.workload, d)
        t.add_row(printable(r.workload), NO_PEER if r.role == NO_PEER else printable(a.target), *mine,
                  "—" if a is None else f"{a.wall_ms:.2f}", efficiency_words(a) if a else Text("—"),
                  speedup_words(r.speedup), "—" if r.speedup is None else r.speedup.verdict,
                  Text(fast_paths_words(r), style="bold red" if r.peer and r.peer.fallbacks else ""))
    return t


def headline_renderables(h: Headline) -> list:
    """The headline section: the table, the reasons behind any bound-suspect, the peers' own
    fallback warnings, and on a CPU what the run can and cannot show."""
    parts: list = [headline_table(h)]
    parts.append(Text("speed-up: the other target's median call over dohnuts' (above 1×: dohnuts is faster), "
                      "its bootstrap 95 % interval and verdict by `dohnuts-bench compare`'s rule; efficiency: "
                      "the critical-path bound over the median call (never above 100 %: a call faster than its "
                      "bound reads bound-suspect). The detail follows.", style="dim"))
    if h.cpu is not None:
        c = h.cpu
        cores = f" of {c.cpus} cores" if c.cpus else ""
        parts += [Text(f"This is a CPU run ({c.device}, {c.threads or '?'} torch thread(s){cores}).", style="bold"),
                  Text(c.shows), Text(c.cannot)]
    seen: set[tuple[str, str]] = set()
    for r in h.rows:
        for s in (r.dohnuts, r.against):
            if s is not None and s.suspect and (r.workload, s.target) not in seen:
                seen.add((r.workload, s.target))
                parts.append(Text(f"bound-suspect: {printable(r.workload)} · {printable(s.target)} ({s.basis} basis): "
                                  f"{s.suspect}", style="yellow"))
    for m in peer_messages(h):
        parts.append(Text(f"peer fallback: {m}", style="red"))
    for b in h.host_bound:
        parts.append(Text(f"host-bound peer: {b}", style="yellow"))
    for c in h.caveats:
        parts.append(Text(f"caveat: {c} (\"This run's machine\", at the end)", style="yellow"))
    return parts
