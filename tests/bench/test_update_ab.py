"""benchmarks/maintainers/update_ab.py: the visiting order, the copies' names and the report's
arithmetic by hand, and one dry run on the CPU's tiny preset (its imports and calls kept alive)."""

from __future__ import annotations

import pytest

from benchmarks.maintainers.update_ab import Variant, copy_names, run, schedule, summarize


def test_rounds_rotate_the_visiting_order():
    assert schedule(["a", "b", "c"], 4) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert schedule([], 2) == [[], []]
    assert copy_names(["main", "x"], 2) == {"main": "main", "x": "x", "main (2)": "main", "x (2)": "x"}


def test_the_report_by_hand():
    variant_of = copy_names(["main", "faster", "slower", "mixed"], 2)
    base = [100.0, 101.0, 100.0, 102.0]  # two rounds of two: round medians 100.5, 101.0
    times = {"main": base, "main (2)": [t + 0.4 for t in base],
             "faster": [t - 2 for t in base], "faster (2)": [t - 1.5 for t in base],
             "slower": [t + 3 for t in base], "slower (2)": [t + 3 for t in base],
             "mixed": [97.0, 97.0, 105.0, 105.0], "mixed (2)": [97.0, 97.0, 105.0, 105.0]}
    out = summarize(times, variant_of, per_round=2)
    assert out["copies"]["main"] == {"median": 100.5, "min": 100.0, "max": 102.0, "round_medians": [100.5, 101.0]}
    v = out["variants"]
    assert v["main"] == {"median": 100.7, "aa_spread_ms": 0.4}  # the pooled median of all 8 updates
    assert v["faster"]["aa_spread_ms"] == 0.5 and v["faster"]["every_round"] == "faster"
    assert v["faster"]["against_first_ms"] == pytest.approx(-1.95)  # pooled medians 98.75 and 100.7
    assert v["slower"]["every_round"] == "slower" and v["slower"]["against_first_ms"] == pytest.approx(2.8)
    assert v["mixed"]["every_round"] == "mixed"


def test_a_dry_run_on_the_cpu():
    """Two variants, one copy each, one round: every update runs inside its variant's patch."""
    seen = []
    variants = [Variant("main"), Variant("patched", lambda: seen.append("in"), lambda: seen.append("out"))]
    out = run(variants, copies=1, rounds=1, per_round=1, warmup=1)
    assert out["gpu"] == "cpu" and set(out["copies"]) == {"main", "patched"}
    assert seen == ["in", "out"] * 2  # its warm-up update and its measured one
    assert all(f["loss"] == f["loss"] for f in out["first"].values())  # finite losses
    assert out["variants"]["patched"]["every_round"] in ("faster", "slower", "mixed")
