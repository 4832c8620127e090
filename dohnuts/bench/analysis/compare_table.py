"""`dohnuts-bench compare` rendered: the comparison as a table that fits any console, and as
strict JSON (dohnuts.bench.analysis.compare computes it)."""

from __future__ import annotations

import math
from dataclasses import asdict

from rich.text import Text

from dohnuts.bench.analysis.compare import FASTER, RULE, SLOWER, WALL, Comparison
from dohnuts.bench.analysis.load_verdict import FASTER_BY_LOAD, SLOWER_BY_LOAD
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.schema import json_safe


def comparison_dict(comparison: Comparison) -> dict:
    """A plain, strict-JSON dict (non-finite numbers as None)."""
    rows = [json_safe(asdict(r)) for r in comparison.rows]
    return {
        "a": comparison.label_a, "b": comparison.label_b, "confidence": comparison.confidence,
        "min_effect": comparison.min_effect, "resamples": comparison.resamples, "seed": comparison.seed,
        "method": comparison.method, "rule": RULE, "rows": rows,
        "only_in_a": [{"workload": w, "target": t} for w, t in comparison.only_in_a],
        "only_in_b": [{"workload": w, "target": t} for w, t in comparison.only_in_b],
        "warnings": list(comparison.warnings),
    }


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    if x is None:
        return "—"
    return "∞" if math.isinf(x) else fmt.format(x)


def comparison_table(comparison: Comparison):
    """A FitTable (fits any console width, never cuts a number): one row per (workload, target,
    stage), then the groups measured in one run only."""
    colour = {SLOWER: "red", FASTER: "green", SLOWER_BY_LOAD: "yellow", FASTER_BY_LOAD: "yellow"}
    t = FitTable(f"B over A (A = {comparison.label_a}, B = {comparison.label_b}); median ms; "
                 f"{100 * comparison.confidence:g}% bootstrap interval of the ratio; Mann-Whitney p; "
                 f"changes under {100 * comparison.min_effect:g}% (or under 1% of the call) are not verdicts",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("stage", "left"),
                  Col("median A"), Col("median B"), Col("ratio"), Col("CI low–high"), Col("p-value"),
                  Col("verdict", "left")],
                 sections=2, groups=[(3, 4), (5, 6), (7, 8)])
    for r in comparison.rows:
        ci = "—" if r.ci_low is None else f"{_num(r.ci_low)}–{_num(r.ci_high)}"
        p = "—" if r.p_value is None else f"{r.p_value:.2g}"
        v = Text(r.verdict, style=colour[r.verdict]) if r.verdict in colour else r.verdict
        t.add_row(r.workload, r.target, r.stage, _ms(r.median_a), _ms(r.median_b), _num(r.ratio, "{:.3f}×"), ci, p, v)
    for (w, tg), where_ in [*((k, "A") for k in comparison.only_in_a), *((k, "B") for k in comparison.only_in_b)]:
        t.add_row(w, tg, "—", "—", "—", "—", "—", "—", f"only in {where_}")
    return t


def load_lines(comparison: Comparison) -> list[str]:
    """One line a workload · target whose whole-call verdict the loads explain
    (dohnuts.bench.analysis.load_verdict): the verdict, the ratio and why."""
    return [f"{r.workload} · {r.target}: {r.verdict} ({_num(r.ratio, '{:.3f}×')}): {r.load}"
            for r in comparison.rows if r.stage == WALL and r.load]
