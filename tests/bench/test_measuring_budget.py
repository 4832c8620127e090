"""Time bounds on the calls a target's measurement adds (dohnuts.bench.measure): the spread-driven
extension past `repeat` stops at EXTEND_FOR_S of measured calls (asv's max_time), and the untimed
twins of the harness A/B stop once they took HARNESS_AB_BUDGET_S (at least HARNESS_AB_MIN_PAIRS):
why, in docs/history/evolution.md M37."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.measure import call, runner
from dohnuts.bench.measure.call import HARNESS_AB_MIN_PAIRS, HARNESS_AB_PAIRS, wants_twin
from dohnuts.bench.measure.runner import extended_calls


def test_the_extension_fits_the_median_call_into_its_seconds():
    assert extended_calls([100.0, 200.0, 300.0], 1.0) == 5        # 1000 ms / a median of 200
    assert extended_calls([2500.0, 2400.0, 2600.0], 20.0) == 8    # the checkpointed peer: 8, not 20
    assert extended_calls([30_000.0], 20.0) == 1                  # never fewer than one


def test_twins_follow_the_first_calls_until_their_budget_is_spent():
    budget_ms = call.HARNESS_AB_BUDGET_S * 1e3
    # short calls: the first HARNESS_AB_PAIRS calls, as before
    assert [wants_twin(i, i * 1.0) for i in range(10)] == [True] * HARNESS_AB_PAIRS + [False] * 2
    # long calls: at least HARNESS_AB_MIN_PAIRS, then none once the twins took the budget
    assert [wants_twin(i, i * budget_ms) for i in range(4)] == [True] * HARNESS_AB_MIN_PAIRS + [False] * 2
    assert wants_twin(3, budget_ms * 0.99) and not wants_twin(HARNESS_AB_PAIRS, 0.0)


@pytest.mark.slow
def test_a_run_whose_budgets_are_spent_measures_repeat_calls_and_the_minimum_of_twins(tmp_path, monkeypatch):
    """A spread target of ±0.1 % asks for many more calls than `repeat` (the cap 12); with no seconds
    left to extend and none for twins, the run measures exactly `repeat` calls, the first
    HARNESS_AB_MIN_PAIRS of them with twins — the bounds, not the spread, decided."""
    monkeypatch.setattr(runner, "EXTEND_FOR_S", 0.0)
    monkeypatch.setattr(call, "HARNESS_AB_BUDGET_S", 0.0)
    workload = tmp_path / "w.yaml"
    workload.write_text("kind: text\ntargets: [dohnuts]\nmodel: tiny\nwarmup: 1\nrepeat: 3\nhalfwidth: 0.001\n"
                        "max_repeat: 12\nshape: {requests: 1, questions: 2, seq_tokens: 48, candidates: 2,"
                        " candidate_tokens: 2}\n")
    assert main(["run", str(workload), "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    steady = [r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())
              if r["phase"] == "steady"]
    assert len(steady) == 3
    twins = [r["harness_overhead"].get("untimed_twin_ms") for r in steady]
    assert all(t is not None and t > 0 for t in twins[:HARNESS_AB_MIN_PAIRS])
    assert twins[HARNESS_AB_MIN_PAIRS:] == [None] * (3 - HARNESS_AB_MIN_PAIRS)
