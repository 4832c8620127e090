"""The load rule (dohnuts.bench.analysis.load_verdict) on hand-made loads and records: a change the
lost share of a core accounts for reads "explained by load" in both directions; equal loads, code
that waits longer, and a change larger than the share lost keep the plain verdict; `compare` and
`gate` apply it and say why, with the exit codes documented."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dohnuts.bench.analysis.compare import FASTER, NO_CHANGE, SLOWER, compare_runs
from dohnuts.bench.analysis.load_verdict import (
    FASTER_BY_LOAD, SLOWER_BY_LOAD, Load, explain, record_load, records_load, weigh,
)
from dohnuts.bench.cli import main
from tests.bench.typed_records import NEUTRAL, typed, typed_all

QUIET = Load(own_cores=0.98, others_cores=0.03, cpus=2, records=20)
BUSY = Load(own_cores=0.52, others_cores=1.45, cpus=2, records=20)  # the busy 2-core machine


def test_a_slowdown_the_lost_share_accounts_for_is_explained_by_load():
    verdict, reason = weigh(SLOWER, 1.893, QUIET, BUSY)
    assert verdict == SLOWER_BY_LOAD
    assert reason == ("this process got 0.52 of a core in B against 0.98 in A; other processes kept 1.45 of 2 "
                      "cores busy against 0.03")


def test_the_other_direction_a_loaded_a_makes_b_faster_by_load():
    verdict, reason = weigh(FASTER, 1 / 1.8, BUSY, QUIET)
    assert verdict == FASTER_BY_LOAD and "0.52 of a core in A against 0.98 in B" in reason


@pytest.mark.parametrize("verdict, ratio", [(SLOWER, 1.893), (FASTER, 0.55), (NO_CHANGE, 1.01)])
def test_equal_loads_keep_the_plain_verdict(verdict, ratio):
    for load in (QUIET, BUSY):
        assert weigh(verdict, ratio, load, load) == (verdict, None)


def test_a_change_larger_than_the_lost_share_is_not_excused():
    # 0.98 / 0.52 = 1.88: up to 2 × that (3.77×: a call's CPU time doubled) is explained, 4× is not
    assert explain(SLOWER, 3.7, QUIET, BUSY) is not None
    assert explain(SLOWER, 4.0, QUIET, BUSY) is None
    assert explain(FASTER, 1 / 4.0, BUSY, QUIET) is None


def test_code_that_waits_longer_is_not_excused():
    """A sleep (or a slower GPU kernel) halves this process's share of a core, but the other
    processes' use stays as it was and the machine is not saturated: the plain verdict stands."""
    waiting = Load(own_cores=0.5, others_cores=0.05, cpus=2, records=20)
    assert explain(SLOWER, 2.0, QUIET, waiting) is None
    # saturated, but the others took no more than before: the share was lost to the code itself
    crowded_both = Load(own_cores=0.98, others_cores=1.4, cpus=2, records=20)
    assert explain(SLOWER, 1.9, crowded_both, BUSY) is None
    # others busier, but an idle core was left: this process could have had it
    sixteen = Load(own_cores=0.5, others_cores=2.0, cpus=16, records=20)
    assert explain(SLOWER, 1.9, Load(0.98, 0.1, 16, 20), sixteen) is None


def test_unknown_loads_and_no_verdict_change_nothing():
    assert weigh(SLOWER, 1.9, None, BUSY) == (SLOWER, None)
    assert weigh(SLOWER, 1.9, QUIET, None) == (SLOWER, None)
    assert weigh(NO_CHANGE, 1.9, QUIET, BUSY) == (NO_CHANGE, None)
    assert weigh(SLOWER, None, QUIET, BUSY) == (SLOWER, None)


def _telemetry(own, others, cpus=2):
    return [{"load": {"others_cores": o, **({} if own is None else {"own_cores": s}), "cpus": cpus, "load1": 3.0}}
            for s, o in zip(own or [None] * len(others), others)]


def test_a_records_load_is_the_median_of_its_samples_and_a_sets_the_median_of_its_records():
    rec = typed({"telemetry": _telemetry([0.9, 0.5, 0.7], [0.1, 1.5, 1.0]) + [{"host": {"cpu_percent": 100}}]})
    assert record_load(rec) == (0.7, 1.0, 2)
    recs = typed_all([{"telemetry": _telemetry([s], [o])} for s, o in ((0.4, 1.6), (0.5, 1.5), (0.9, 0.2))])
    load = records_load(recs)
    assert (load.own_cores, load.others_cores, load.cpus, load.records, load.own_estimated) == (0.5, 1.5, 2, 3, False)
    assert records_load(typed_all([{"telemetry": []}, {}])) is None


def test_records_without_own_cores_estimate_the_share_and_say_so():
    """The committed CPU baselines recorded `others_cores` only: a one-thread run's share is then
    what the others left of the machine, up to one core."""
    busy = records_load(typed_all([{"telemetry": _telemetry(None, [1.6])}] * 3))
    quiet = records_load(typed_all([{"telemetry": _telemetry(None, [0.1])}] * 3))
    assert busy.own_estimated and busy.own_cores == pytest.approx(0.4) and quiet.own_cores == 1.0
    verdict, reason = weigh(SLOWER, 2.2, quiet, busy)
    assert verdict == SLOWER_BY_LOAD and "estimated" in reason


# ------------------------------------------------------------------------------- compare and gate


def _calls(n: int, wall: float, own: float, others: float, *, seed: int, workload: str = "text") -> list[dict]:
    """n steady calls around `wall` ms (2 % noise), each with the load telemetry of its call."""
    rng = np.random.default_rng(seed)
    return [NEUTRAL | {"schema": 1, "run_id": "r", "iteration": i, "workload": {"name": workload}, "target": "dohnuts",
             "phase": "steady", "aa_half": i % 2, "wall_ms": float(wall * math.exp(0.02 * rng.standard_normal())),
             "stages": {"forward": {"host_ms": 0.8 * wall, "device_ms": None, "count": 1}},
             "telemetry": _telemetry([own, own], [others, others])} for i in range(n)]


def _run_dir(root, name: str, records: list[dict]):
    d = root / name
    d.mkdir()
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "run.json").write_text(json.dumps({"run_id": name}))
    return d


def test_compare_weighs_the_loads_of_each_workload():
    a = _calls(12, 10.0, 0.98, 0.03, seed=1) + _calls(12, 10.0, 0.98, 0.03, seed=2, workload="image")
    b = _calls(12, 18.9, 0.52, 1.45, seed=3) + _calls(12, 18.9, 0.98, 0.03, seed=4, workload="image")
    comp = compare_runs(typed_all(a), typed_all(b))
    loaded, plain = comp.row("text", "dohnuts"), comp.row("image", "dohnuts")
    assert loaded.verdict == SLOWER_BY_LOAD and "0.52 of a core in B" in loaded.load
    assert comp.row("text", "dohnuts", "forward").verdict == SLOWER_BY_LOAD  # the stages too
    assert plain.verdict == SLOWER and plain.load is None  # equal loads: a regression


def test_cli_compare_prints_the_load_explanation_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    a = _run_dir(tmp_path, "a", _calls(12, 10.0, 0.98, 0.03, seed=1))
    b = _run_dir(tmp_path, "b", _calls(12, 18.9, 0.52, 1.45, seed=2))
    same_load = _run_dir(tmp_path, "c", _calls(12, 18.9, 0.98, 0.03, seed=3))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 0
    captured = capsys.readouterr()
    text = " ".join(captured.out.split())
    assert ("load: text · dohnuts: slower, explained by load (1.8" in text
            and "this process got 0.52 of a core in B against 0.98 in A" in text)
    assert "explained by the machine's load (not a regression" in captured.err
    row = next(r for r in json.loads(out.read_text())["rows"] if r["stage"] == "wall")
    assert row["verdict"] == SLOWER_BY_LOAD and row["load"].startswith("this process got 0.52")
    # the same slowdown with equal loads is a regression: exit 1, no word about load
    assert main(["compare", str(a), str(same_load)]) == 1
    captured = capsys.readouterr()
    assert "explained by load" not in captured.out + captured.err and "slower in B" in captured.err
    # and the other direction: B quiet against a loaded A is "faster, explained by load"
    assert main(["compare", str(b), str(a)]) == 0
    assert "faster, explained by load" in capsys.readouterr().out


def test_gate_passes_a_slowdown_the_load_explains_and_fails_the_same_one_at_equal_load(tmp_path):
    from dohnuts.bench.commands.gate import gate, run_loads

    bases = [_run_dir(tmp_path, f"base-{k}", _calls(12, 10.0, 0.98, 0.03, seed=k)) for k in range(3)]
    loaded = _run_dir(tmp_path, "loaded", _calls(12, 18.9, 0.52, 1.45, seed=7))
    quiet = _run_dir(tmp_path, "quiet", _calls(12, 18.9, 0.98, 0.03, seed=8))
    from dohnuts.bench.commands.gate import timings

    baselines = [timings(b) for b in bases]
    ok, lines = gate(baselines, timings(loaded), base_loads=run_loads(bases), current_loads=run_loads([loaded]))
    assert ok and "slower, explained by load (this process got 0.52 of a core in this run against 0.98 in the " \
                  "baseline" in lines[0]
    ok, lines = gate(baselines, timings(quiet), base_loads=run_loads(bases), current_loads=run_loads([quiet]))
    assert not ok and lines[0].endswith(": slower")


def test_a_process_that_ran_between_two_polls_reads_a_share_above_zero():
    """The load sampler's own share is read at the CPU clock's resolution: a poll after ≥ 1 ms of
    this process's CPU time reads more than 0 (in the kernel's 10-ms ticks, most such polls read
    0 CPU seconds, and a fast workload's median share read 0.0 though it had a whole core), and at
    most the machine's cores (the share counts every thread of the process, so over a millisecond
    the test process's other threads can take it past one core)."""
    import time

    from dohnuts_bench_plugins.analyzers.load import LoadSampler

    sampler = LoadSampler()
    shares = []
    for _ in range(30):
        start = time.process_time()
        while time.process_time() - start < 1e-3:
            pass
        shares.append(sampler.sample()["own_cores"])
    assert all(0 < s <= sampler.cpus for s in shares), shares
