"""`dohnuts-bench compare`: ratio of medians with a bootstrap interval, rank test and verdict; the
calls a precision needs; the spread warning; the A/A noise budget; the CLI and its errors."""

from __future__ import annotations

import io
import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from dohnuts.bench.analysis.compare import (
    FASTER, NO_CHANGE, SLOWER, TOO_FEW, aa_noise, compare_runs, required_calls, spread_warning,
)
from dohnuts.bench.analysis.compare_table import comparison_dict, comparison_table
from dohnuts.bench.analysis.records import CallRecord, RecordError
from dohnuts.bench.cli import main
from dohnuts.errors import DohnutsError
from tests.bench.typed_records import NEUTRAL, typed_all

STAGES = {"prefix": 40.0, "suffix": 50.0}   # ms around which each stage's calls scatter; wall around 100 ms


def _records(n: int, *, scale: float = 1.0, seed: int = 0, sigma: float = 0.1, workload: str = "w",
             target: str = "dohnuts") -> list[dict]:
    """n steady calls, every time lognormal around its typical value × scale (sigma in log units);
    prefix as host time only, suffix as device time (the one stage_ms must pick)."""
    rng = np.random.default_rng(seed)

    def t(ms: float) -> float:
        return float(ms * scale * math.exp(sigma * rng.standard_normal()))

    return [NEUTRAL | {"schema": 1, "run_id": "r", "iteration": i, "workload": {"name": workload}, "target": target,
             "phase": "steady", "wall_ms": t(100.0),
             "stages": {"prefix": {"host_ms": t(STAGES["prefix"]), "device_ms": None, "count": 1},
                        "suffix": {"host_ms": 0.5, "device_ms": t(STAGES["suffix"]), "count": 1}}}
            for i in range(n)]


def _recs(n: int, **kw) -> list[CallRecord]:
    """`_records` as the reader gives them back."""
    return typed_all(_records(n, **kw))


def _verdicts(comp, workload="w", target="dohnuts") -> dict[str, str]:
    return {r.stage: r.verdict for r in comp.rows if (r.workload, r.target) == (workload, target)}


def test_two_samples_of_one_distribution_show_no_detectable_change():
    comp = compare_runs(_recs(12, seed=1), _recs(12, seed=2))
    assert _verdicts(comp) == {"wall": NO_CHANGE, "prefix": NO_CHANGE, "suffix": NO_CHANGE}
    wall = comp.row("w", "dohnuts")
    assert wall.n_a == wall.n_b == 12
    assert wall.ci_low < 1.0 < wall.ci_high and wall.p_value > 0.05
    assert wall.ratio == pytest.approx(wall.median_b / wall.median_a)
    assert comp.only_in_a == comp.only_in_b == ()


def test_false_alarms_are_rare_and_a_2x_slowdown_is_always_found_with_10_calls():
    alarms = sum(compare_runs(_recs(10, seed=2 * s), _recs(10, seed=2 * s + 1), resamples=999)
                 .row("w", "dohnuts").verdict != NO_CHANGE for s in range(40))
    assert alarms <= 2                                     # at most 5 % of 40 A/A pairs
    found = sum(compare_runs(_recs(10, seed=2 * s), _recs(10, seed=2 * s + 1, scale=2.0), resamples=999)
                .row("w", "dohnuts").verdict == SLOWER for s in range(20))
    assert found == 20


def test_twice_as_slow_is_slower_with_an_interval_around_2():
    comp = compare_runs(_recs(10, seed=1), _recs(10, seed=2, scale=2.0))
    assert _verdicts(comp) == {"wall": SLOWER, "prefix": SLOWER, "suffix": SLOWER}
    for r in comp.rows:
        assert 1.0 < r.ci_low < 2.0 < r.ci_high, r
        assert r.ratio == pytest.approx(2.0, rel=0.15)
        assert r.p_value < 0.001
    suffix = comp.row("w", "dohnuts", "suffix")                 # device time, not the 0.5 ms host time
    assert suffix.median_a == pytest.approx(STAGES["suffix"], rel=0.1)


def test_half_the_time_is_faster():
    comp = compare_runs(_recs(10, seed=1), _recs(10, seed=2, scale=0.5))
    assert _verdicts(comp) == {"wall": FASTER, "prefix": FASTER, "suffix": FASTER}
    wall = comp.row("w", "dohnuts")
    assert wall.ci_low < 0.5 < wall.ci_high < 1.0


def test_the_result_is_deterministic_for_a_seed():
    a, b = _recs(10, seed=1), _recs(10, seed=2, scale=1.1)
    first, again = compare_runs(a, b, seed=3), compare_runs(a, b, seed=3)
    assert first.rows == again.rows
    assert compare_runs(a, b, seed=4).row("w", "dohnuts").ci_low != first.row("w", "dohnuts").ci_low


def test_a_change_smaller_than_min_effect_is_no_verdict_even_when_certain():
    a, b = _recs(20, seed=1, sigma=0.001), _recs(20, seed=2, sigma=0.001, scale=1.01)
    wall = compare_runs(a, b).row("w", "dohnuts")               # min_effect 2 %: a certain 1 % is no verdict
    assert 1.0 < wall.ci_low and wall.ci_high < 1.02 and wall.p_value < 1e-6
    assert wall.verdict == NO_CHANGE
    assert compare_runs(a, b, min_effect=0.005).row("w", "dohnuts").verdict == SLOWER


def test_groups_and_stages_in_one_run_only_and_first_calls_are_listed_apart():
    a = _records(5, seed=1) + _records(5, seed=3, workload="only-a")
    a.append(_records(1, seed=9, scale=50.0)[0] | {"phase": "first-call"})   # never in the statistics
    b = _records(5, seed=2) + _records(5, seed=4, target="transformers")
    for rec in b[:5]:
        rec["stages"]["vision"] = {"host_ms": 3.0, "device_ms": None, "count": 1}
    comp = compare_runs(typed_all(a), typed_all(b))
    assert comp.only_in_a == (("only-a", "dohnuts"),)
    assert comp.only_in_b == (("w", "transformers"),)
    assert comp.groups == [("w", "dohnuts")]
    assert comp.row("w", "dohnuts").n_a == 5                    # the first call is not counted
    vision = comp.row("w", "dohnuts", "vision")
    assert (vision.verdict, vision.n_a, vision.median_b) == ("only in B", 0, 3.0)
    d = json.loads(json.dumps(comparison_dict(comp)))
    assert d["only_in_a"] == [{"workload": "only-a", "target": "dohnuts"}]
    assert d["only_in_b"] == [{"workload": "w", "target": "transformers"}]
    assert {r["stage"] for r in d["rows"]} == {"wall", "prefix", "suffix", "vision"}


def test_too_few_calls_give_no_verdict_and_three_calls_cannot_pass_the_rank_test():
    two = compare_runs(_recs(2, seed=1), _recs(10, seed=2, scale=3.0)).row("w", "dohnuts")
    assert two.verdict == TOO_FEW and two.ci_low is None and two.ratio > 2
    three = compare_runs(_recs(3, seed=1), _recs(3, seed=2, scale=3.0)).row("w", "dohnuts")
    assert three.p_value == pytest.approx(0.1)                  # exact two-sided minimum for 3 vs 3
    assert three.ci_low > 2.0                                   # the interval alone would have said slower
    assert three.verdict == NO_CHANGE
    four = compare_runs(_recs(4, seed=1), _recs(4, seed=2, scale=3.0)).row("w", "dohnuts")
    assert four.p_value == pytest.approx(2 / 70) and four.verdict == SLOWER


def test_identical_and_zero_times():
    a = typed_all([{"schema": 1, "workload": {"name": "w"}, "target": "t", "wall_ms": 5.0,
                    "stages": {"idle": {"host_ms": 0.0, "device_ms": None, "count": 1}}} for _ in range(4)])
    comp = compare_runs(a, a)
    assert comp.row("w", "t").ci_low == comp.row("w", "t").ci_high == 1.0
    assert comp.row("w", "t").verdict == NO_CHANGE and comp.row("w", "t", "idle").verdict == NO_CHANGE


def test_bad_options_and_records_are_errors_naming_the_field():
    with pytest.raises(DohnutsError, match="field 'confidence'"):
        compare_runs(_recs(3), _recs(3), confidence=95)
    bad = _records(3)
    bad[1]["wall_ms"] = "slow"
    with pytest.raises(RecordError, match="field 'wall_ms'"):  # (as the reader reads the record)
        compare_runs(typed_all(bad), _recs(3))


def test_the_table_renders_every_row():
    from rich.console import Console

    comp = compare_runs(_recs(10, seed=1), _recs(10, seed=2, scale=2.0) + _recs(3, workload="new"))
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(comparison_table(comp))
    text = console.export_text()
    for piece in ("median A", "CI low–high", "p-value", "slower", "only in B", "new"):
        assert piece in text


def test_required_calls_by_hand():
    samples = [90.0, 95.0, 100.0, 105.0, 110.0]                 # p10 92, p90 108 (linear), median 100
    z, z90 = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.9)
    sigma = (108.0 - 92.0) / (2 * z90)
    by_hand = math.ceil((z * math.sqrt(math.pi / 2) * sigma / (0.05 * 100.0)) ** 2)
    assert by_hand == 10
    assert required_calls(samples) == 10
    assert required_calls(samples, rel_halfwidth=0.1) == 3      # ceil(2.35)
    assert required_calls(samples, rel_halfwidth=0.2) == 3      # 0.59 → never fewer than 3
    assert required_calls([80.0, 90.0, 100.0, 110.0, 120.0]) == 38   # twice the spread, 4× the calls
    assert required_calls(samples, confidence=0.99) > 10
    noisy = [float(x) for x in 100 * np.exp(0.3 * np.random.default_rng(0).standard_normal(30))]
    assert required_calls(noisy) > required_calls(samples)
    assert required_calls(noisy, rel_halfwidth=0.02) > required_calls(noisy, rel_halfwidth=0.05)


def test_spread_warning_fires_for_the_issue_spread_not_for_2_percent():
    issue = [1.0] * 6 + [5.0, 20.0, 39.34, 39.34]               # median 1, p10 1, p90 39.34: spread 3,834 %
    warning = spread_warning(issue, 0.05)
    assert warning is not None and "3,834%" in warning and "\n" not in warning
    calm = [99.0, 99.0, 100.0, 100.0, 100.0, 100.0, 100.0, 101.0, 101.0, 101.0]   # spread 2 %
    assert spread_warning(calm, 0.05) is None


def test_aa_noise_compares_the_interleaved_halves():
    recs = _recs(20, seed=5)
    for i, rec in enumerate(recs):
        rec.aa_half = i % 2
    budget = aa_noise(recs + _recs(4, workload="other"), ("w", "dohnuts"))
    wall = budget.row()
    assert (wall.n_a, wall.n_b) == (10, 10)
    assert wall.ci_low < 1.0 < wall.ci_high and wall.verdict == NO_CHANGE
    assert 0.0 < budget.halfwidth() < 0.2
    assert {r.stage for r in budget.rows} == {"wall", "prefix", "suffix"}
    with pytest.raises(RecordError, match="field 'aa_half'"):
        aa_noise(_recs(4), ("w", "dohnuts"))
    with pytest.raises(DohnutsError, match="no steady-state records"):
        aa_noise(recs, ("w", "transformers"))


# --------------------------------------------------------------------------------------------- CLI


def _run_dir(root, name: str, records: list[dict]):
    d = root / name
    d.mkdir()
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "run.json").write_text(json.dumps({"run_id": name}))
    return d


def test_cli_compare_prints_the_verdicts_and_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    a = _run_dir(tmp_path, "a", _records(10, seed=1) + _records(10, seed=3, workload="steady"))
    b = _run_dir(tmp_path, "b", _records(10, seed=2, scale=2.0) + _records(10, seed=4, workload="steady"))
    out = tmp_path / "cmp.json"
    # exit 1: a whole call is slower in B (a CI can use it); the table is on stdout, the verdict on stderr
    assert main(["compare", str(a), str(b / "results.jsonl"), "--json", str(out)]) == 1
    captured = capsys.readouterr()
    text = captured.out
    assert "slower" in text and "no detectable change" in text
    assert "slower in B (whole call): w · dohnuts" in captured.err
    assert main(["compare", str(a), str(a)]) == 0  # the same run: no change
    assert main(["compare", str(b), str(a)]) == 0  # B faster than A: not a regression
    data = json.loads(out.read_text())
    verdicts = {(r["workload"], r["stage"]): r["verdict"] for r in data["rows"]}
    assert verdicts[("w", "wall")] == SLOWER and verdicts[("steady", "wall")] == NO_CHANGE
    assert data["confidence"] == 0.95 and data["a"].endswith("results.jsonl")


def test_cli_compare_bad_inputs_are_one_line_with_exit_2(tmp_path, capsys):
    a = _run_dir(tmp_path, "a", _records(5, seed=1))
    missing = tmp_path / "nope"
    assert main(["compare", str(a), str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: does not exist" in err and err.count("\n") == 1
    (tmp_path / "no-results").mkdir()                          # a directory without its results.jsonl
    assert main(["compare", str(tmp_path / "no-results"), str(a)]) == 2
    assert str(tmp_path / "no-results" / "results.jsonl") in capsys.readouterr().err

    corrupt = _run_dir(tmp_path, "corrupt", _records(3, seed=2))
    lines = (corrupt / "results.jsonl").read_text().splitlines()
    (corrupt / "results.jsonl").write_text("\n".join([lines[0], lines[1][:30], lines[2]]) + "\n")
    assert main(["compare", str(a), str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert str(corrupt / "results.jsonl") in err and "line 2" in err and err.count("\n") == 1

    other = _run_dir(tmp_path, "other", _records(5, seed=2, workload="elsewhere"))
    assert main(["compare", str(a), str(other)]) == 2
    err = capsys.readouterr().err
    assert "no (workload, target) measured in both runs" in err and "elsewhere" in err

    empty = _run_dir(tmp_path, "empty", [])
    assert main(["compare", str(empty), str(a)]) == 2
    assert "holds no steady-state records" in capsys.readouterr().err


# ------------------------------------------------------------------------ hostile input (issue 33)


def test_cli_compare_of_one_call_per_group_says_too_few_calls(tmp_path, capsys, monkeypatch):
    """One steady call per (workload, target) was a traceback (the spread of one number): now the
    rows say 'too few calls' and the command exits 0."""
    monkeypatch.setenv("COLUMNS", "220")
    a = _run_dir(tmp_path, "a", _records(1, seed=1))
    b = _run_dir(tmp_path, "b", _records(1, seed=2))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["verdict"] for r in rows} == {TOO_FEW}


@pytest.mark.parametrize("where, why", [
    ("dir", "field '--json': is a directory, not a JSON file to write"),
    ("/dev/full", "field '--json': is a character device, not a JSON file to write"),
    ("fifo", "field '--json': is a FIFO (named pipe), not a JSON file to write"),
    ("long", "field '--json': has a name longer than the file system allows"),
    ("read-only", "field '--json': cannot be"),
])
def test_cli_compare_json_that_cannot_be_written_is_one_line_before_any_work(tmp_path, capsys, monkeypatch,
                                                                            where, why):
    import os

    from tests.hostile import fifo, no_hang

    a = _run_dir(tmp_path, "a", _records(5, seed=1))
    b = _run_dir(tmp_path, "b", _records(5, seed=2))
    if where == "dir":
        out = tmp_path / "a"
    elif where == "fifo":
        out = fifo(tmp_path / "pipe.json")
    elif where == "long":
        out = tmp_path / ("j" * 300 + ".json")
    elif where == "read-only":
        (tmp_path / "ro").mkdir()
        out = tmp_path / "ro" / "cmp.json"
        os.chmod(out.parent, 0o555)
        if os.geteuid() == 0:  # root writes anywhere: the refusal of a read-only folder is simulated
            monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    else:
        out = where
    try:
        with no_hang():
            assert main(["compare", str(a), str(b), "--json", str(out)]) == 2
    finally:
        monkeypatch.undo()
        if where == "read-only":
            os.chmod(out.parent, 0o755)
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and why in captured.err and str(out)[:100] in captured.err, captured.err
    assert "slower" not in captured.out and "no detectable change" not in captured.out  # refused before the table


@pytest.mark.parametrize("value", [1e308, 1e11, -1.0, True, "12"])
def test_cli_compare_refuses_an_absurd_wall_time_naming_its_line(tmp_path, capsys, value):
    """wall_ms 1e308 once overflowed the statistics into a traceback: every record compare reads is
    checked against the record schema (dohnuts.bench.analysis.records), one line naming file, line, field."""
    a = _run_dir(tmp_path, "a", _records(5, seed=1))
    recs = _records(5, seed=2)
    recs[3]["wall_ms"] = value
    b = _run_dir(tmp_path, "b", recs)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{b / 'results.jsonl'}:4" in err and "wall_ms" in err, err


def test_a_workload_whose_file_changed_between_the_runs_is_said():
    """A workload measured from another file in B (its hash) gets a warning line naming both
    hashes; the same file, or a run whose records carry no hash, none."""
    def with_hash(records, h):
        return typed_all([r | {"workload": {"name": r["workload"]["name"], "file_hash": h}} for r in records])

    a, b = _records(6, seed=1), _records(6, seed=2)
    changed = compare_runs(with_hash(a, "1dafef287c8ed244"), with_hash(b, "1f7dc3977c4efd82"))
    assert changed.warnings[0] == ("w: its workload file changed between the runs (file hash 1dafef287c8ed244 → "
                                   "1f7dc3977c4efd82): a difference may come from the workload, not the code")
    assert _verdicts(changed) == _verdicts(compare_runs(typed_all(a), typed_all(b)))  # the verdicts stand
    for same in (compare_runs(with_hash(a, "1dafef287c8ed244"), with_hash(b, "1dafef287c8ed244")),
                 compare_runs(typed_all(a), with_hash(b, "1f7dc3977c4efd82"))):
        assert not any("workload file changed" in w for w in same.warnings)


def test_runs_measured_on_different_machines_are_said():
    """Two runs on different devices (the records' device names) get one warning naming both, first;
    the verdicts stand. Runs on one device, none. A hostile device name reaches the terminal escaped."""
    def on(records, name):
        return typed_all([r | {"device": {"name": name, "type": "cuda"}} for r in records])

    a, b = _records(6, seed=1), _records(6, seed=2)
    mixed = compare_runs(on(a, "NVIDIA H200"), on(b, "NVIDIA H100 80GB HBM3"))
    assert mixed.warnings[0] == ("the runs measured on different machines (A: NVIDIA H200; B: NVIDIA H100 80GB HBM3): "
                                 "every difference includes the machine's, not only the code's")
    assert _verdicts(mixed) == _verdicts(compare_runs(on(a, "NVIDIA H200"), on(b, "NVIDIA H200")))
    assert not any("different machines" in w for w in compare_runs(on(a, "NVIDIA H200"), on(b, "NVIDIA H200")).warnings)


def test_cli_compare_escapes_a_hostile_device_name(tmp_path, capsys):
    a = _run_dir(tmp_path, "a", [r | {"device": {"name": "GPU\x1b]52;c;aGk=\x07", "type": "cuda"}}
                                for r in _records(6, seed=1)])
    b = _run_dir(tmp_path, "b", _records(6, seed=2))
    main(["compare", str(a), str(b)])
    out = capsys.readouterr().out
    assert "different machines" in out and "\x1b" not in out and "\x07" not in out and "\\x1b" in out
