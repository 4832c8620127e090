"""`dohnuts-bench history` per machine (dohnuts.bench.store.history): a series is one machine, device,
model, precision and hwspec, so CPU and H200 runs never meet in one; level shifts are found over
the whole series (an L1 piecewise-constant fit, asv's step detection) and judged by compare's
statistics with a threshold from measured noise; a flat noisy series flags nothing; a shift the
load explains is not flagged; the store's schema-2 files are migrated; the command is short and
filterable, and a fresh clone's first use imports the committed archive."""

from __future__ import annotations

import io
import json
import math
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from dohnuts.bench.analysis.compare import SLOWER, compare_samples
from dohnuts.bench.analysis.load_verdict import SLOWER_BY_LOAD
from dohnuts.bench.cli import main
from dohnuts.bench.store.history import aa_halfwidth, history, history_tables, level_penalty, level_starts
from dohnuts.bench.store.run_store import APPLICATION_ID, SCHEMA_VERSION, RunStore
from tests.bench.typed_records import NEUTRAL, typed, typed_all

ROOT = Path(__file__).resolve().parents[2]
CPU_RUNS = [ROOT / "results" / "baselines" / "cpu-amd-epyc-2cores-1thread" / f"run-{k}" for k in (1, 2, 3)]
H200_RUNS = [ROOT / "results" / "h200" / n for n in ("2026-12-02-s16-fresh-suite", "2026-12-02-s18-fresh-suite",
                                                      "2026-12-03-s19-one-stream-suite")]

GPU = {"machine": "nvidia-h200", "device": "NVIDIA H200", "kind": "cuda", "model": "qwen3.5-2b", "precision": "bf16",
       "hwspec": "h200"}
CPU = {"machine": "cpu-amd-epyc-2cores-1thread", "device": "x86_64", "kind": "cpu", "model": "tiny",
       "precision": "fp32", "hwspec": None}


def _add_run(store: RunStore, k: int, median: float, rng: np.random.Generator, *, where: dict = GPU,
             revision: str | None = None, dirty: bool = True, calls: int = 10, within: float = 0.02,
             load: tuple[float, float] | None = None, workload: str = "text", target: str = "dohnuts",
             file_hash: str | None = None) -> str:
    """Run number k (its id orders it in time) whose calls scatter lognormally (`within`) around
    `median`, recorded as a run of `where`, each call with the load (own, others) when given."""
    run_id = f"20261201-{k // 60:02d}{k % 60:02d}00-r{k}"
    rev = revision or f"rev{k:04d}"
    meta = {"run_id": run_id, "hwspec": where["hwspec"], "measured": {"machine": {"id": where["machine"]}},
            "provenance": {"git": rev + ("+dirty" if dirty else ""),
                           "device": {"type": where["kind"], "name": where["device"]}}}
    if file_hash is not None:  # run.json's workloads: the file each was read from, by its hash
        meta["workloads"] = [{"name": workload, "file_hash": file_hash}]
    telemetry = [] if load is None else [{"load": {"own_cores": load[0], "others_cores": load[1], "cpus": 2}}]
    recs = [NEUTRAL | {"schema": 1, "run_id": run_id, "iteration": i, "workload": {"name": workload}, "target": target,
             "phase": "steady", "aa_half": i % 2, "wall_ms": float(median * math.exp(within * rng.standard_normal())),
             "stages": {}, "model_source": where["model"], "precision": where["precision"],
             "device": {"name": where["device"], "type": where["kind"]}, "telemetry": telemetry}
            for i in range(calls)]
    store.add_run(run_id, meta)
    store.add_records(run_id, typed_all(recs))
    return run_id


def _levels(rng, levels: list[float], runs_each: int, between: float) -> list[float]:
    """Run medians: `runs_each` runs a level, each run off its level by lognormal noise `between`."""
    return [lv * math.exp(between * rng.standard_normal()) for lv in levels for _ in range(runs_each)]


def _naive(samples_per_run: list[list[float]]) -> int:
    """What the former history flagged: each run against the one before, the threshold the larger
    of 2 % and the two runs' own A/A noise — no noise between runs."""
    flags = 0
    for a, b in zip(samples_per_run, samples_per_run[1:]):
        halves = [i % 2 for i in range(len(a))]
        noise = [x for x in (aa_halfwidth(a, halves, 0.95), aa_halfwidth(b, halves, 0.95)) if x is not None]
        c = compare_samples("pair", a, b, min_effect=max([0.02] + noise), resamples=999)
        flags += c.verdict in ("slower", "faster")
    return flags


def _samples(store: RunStore) -> list[list[float]]:
    by_run: dict[str, list[float]] = {}
    for c in store.steady_calls():
        by_run.setdefault(c["run_id"], []).append(c["wall_ms"])
    return list(by_run.values())


# ------------------------------------------------------------------------------ level shifts


def test_level_starts_by_hand():
    """The exact Potts fit: a level costs gamma, a point its distance to its level's median."""
    assert level_starts([5.0], 0.1) == [] and level_starts([], 0.1) == []
    assert level_starts([0.0] * 6, 0.0) == []
    assert level_starts([0, 0, 0, 0, 1, 1, 1, 1], 0.5) == [4]
    assert level_starts([0, 0, 0, 1, 1, 1, 0, 0, 0], 0.5) == [3, 6]
    wiggle = [0.0, 0.01, -0.01, 0.005, -0.004, 0.0]
    assert level_starts(wiggle, 0.05) == [] and level_starts(wiggle, 0.0) == [1, 2, 3, 4, 5]
    # one point 1 off in 5: a level of its own saves 1 and costs two levels (2 gamma)
    assert level_starts([0, 0, 1, 0, 0], 0.49) == [2, 3] and level_starts([0, 0, 1, 0, 0], 0.51) == []
    # the penalty from noise: 2 ln(n) mean absolute deviations; none measured: every run a level
    assert level_penalty(0.05, 16) == pytest.approx(2 * math.log(16) * 0.05 * math.sqrt(2 / math.pi))
    assert level_penalty(None, 3) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_level_shift_is_found_over_the_whole_series(tmp_path, seed):
    """Sixteen runs, the last eight 15 % slower; runs scatter by 3 % between them, calls by 2 %
    within: history finds one shift, at run 8, judged over the two levels (8 runs each) — the ratio
    of the levels, not of two neighbours — and nothing in the scatter around either level."""
    rng = np.random.default_rng(seed)
    with RunStore(tmp_path / "s.sqlite") as store:
        medians = _levels(rng, [10.0, 11.5], 8, 0.03)
        for k, m in enumerate(medians):
            _add_run(store, k, m, rng)
        (series,) = history(store)
        (step,) = series.changes
        assert (step.at, step.runs_before, step.runs_after, step.verdict) == (8, 8, 8, SLOWER)
        assert step.ratio == pytest.approx(1.15, rel=0.04) and step.ci_low > 1.0 + step.min_effect
        assert step.ratio != pytest.approx(medians[8] / medians[7], rel=1e-3)  # not the two neighbours' ratio
        assert series.noise == pytest.approx(0.03, abs=0.02)  # the scatter between runs, measured


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_flat_noisy_series_flags_nothing_where_neighbours_would(tmp_path, seed):
    """Sixteen runs of one level, scattered by 5 % between runs (a shared machine) and 2 % within:
    no flag — while comparing each run with the one before by its own calls flags some."""
    rng = np.random.default_rng(seed)
    with RunStore(tmp_path / "s.sqlite") as store:
        for k, m in enumerate(_levels(rng, [10.0], 16, 0.05)):
            _add_run(store, k, m, rng)
        (series,) = history(store)
        assert series.changes == [] and len(series.points) == 16
        assert _naive(_samples(store)) > 0  # the neighbour rule this replaces would have flagged noise


def test_runs_of_one_clean_revision_measure_the_noise_between_runs(tmp_path):
    """Four runs of one commit, no uncommitted change, alternating 10 and 14 ms (a machine whose
    load came and went): whatever moved, the code did not — nothing is flagged."""
    rng = np.random.default_rng(3)
    with RunStore(tmp_path / "s.sqlite") as store:
        for k, m in enumerate([10.0, 14.0, 10.0, 14.0, 10.0]):
            _add_run(store, k, m, rng, revision="abc123", dirty=False, within=0.01)
        (series,) = history(store)
        assert series.changes == [] and series.noise > 0.3
        assert _naive(_samples(store)) == 4  # each pair of neighbours would have been a "change"


def test_a_shift_the_load_explains_is_said_and_not_flagged(tmp_path, capsys):
    """Four quiet runs at 10 ms, then four at 18.9 ms whose process got half a core while other
    processes held the 2-core machine: "slower, explained by load", with the reason, no flag."""
    rng = np.random.default_rng(4)
    path = tmp_path / "s.sqlite"
    with RunStore(path) as store:
        for k in range(8):
            _add_run(store, k, 10.0 if k < 4 else 18.9, rng, where=CPU,
                     load=(0.98, 0.03) if k < 4 else (0.52, 1.45))
        (series,) = history(store)
        (step,) = series.steps
        assert step.at == 4 and step.verdict == SLOWER_BY_LOAD and not step.flagged and series.changes == []
        assert step.load.startswith("this process got 0.52 of a core in the runs after against 0.98")
    assert main(["history", "--store", str(path)]) == 0
    captured = capsys.readouterr()
    assert "slower, explained by load 1.8" in " ".join(captured.out.split())
    assert "0 flagged level shift(s)" in captured.err


def test_a_run_whose_workload_file_changed_is_said_where_it_changed(tmp_path, capsys):
    """Four runs at 10 ms from one workload file, four at 15 ms from another (its hash): the shift
    is judged as any, and the line and the table say the file changed at the first run of the new
    file; runs without a recorded hash change nothing."""
    rng = np.random.default_rng(5)
    path = tmp_path / "s.sqlite"
    with RunStore(path) as store:
        for k in range(8):
            _add_run(store, k, 10.0 if k < 4 else 15.0, rng,
                     file_hash="1dafef287c8ed244" if k < 4 else "1f7dc3977c4efd82")
        _add_run(store, 8, 15.0, rng)  # a run whose run.json names no file: not a change
        (series,) = history(store)
        assert series.file_changes == [4] and [p.file_hash for p in series.points][3:] == [
            "1dafef287c8ed244", "1f7dc3977c4efd82", "1f7dc3977c4efd82", "1f7dc3977c4efd82", "1f7dc3977c4efd82", None]
        (step,) = series.changes
        assert step.at == 4 and step.verdict == SLOWER
        console = Console(width=400, file=io.StringIO())
        for table in history_tables([series]):
            console.print(table)
        rows = [line for line in console.file.getvalue().splitlines() if "r4 " in line or "changed here" in line]
        assert len(rows) == 1 and "20261201-000400-r4" in rows[0] and "the workload's file changed here" in rows[0]
    assert main(["history", "--store", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the workload's file changed at rev0004+dirty 20261201-000400-r4" in out


@pytest.mark.parametrize("cell", ["5", '{"name": "w"}', '"text"', "null", "not json", '[3, {"name": 1}]'])
def test_a_hand_edited_workloads_cell_names_no_file_and_breaks_nothing(tmp_path, capsys, cell):
    """A run's `workloads` cell edited into a number, an object, a string, null, broken JSON or a list
    of the wrong things: that run's points carry no file hash, the history reads as before."""
    rng = np.random.default_rng(6)
    path = tmp_path / "s.sqlite"
    with RunStore(path) as store:
        for k in range(3):
            _add_run(store, k, 10.0, rng, file_hash="1dafef287c8ed244")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET workloads = ? WHERE run_id = ?", (cell, "20261201-000100-r1"))
    with RunStore(path) as store:
        (series,) = history(store)
        assert [p.file_hash for p in series.points] == ["1dafef287c8ed244", None, "1dafef287c8ed244"]
        assert series.file_changes == []
    assert main(["history", "--store", str(path)]) == 0


# --------------------------------------------------------------------------------- machines


def test_cpu_and_h200_runs_are_separate_series_and_nothing_is_flagged_between_them(tmp_path):
    """The committed 2-core CPU baseline runs (tiny) and three H200 suite runs (2b) all measured
    workload `text` with target `dohnuts`: two series, one a machine, each holding exactly its
    machine's runs (as their run.json say)."""
    with RunStore(tmp_path / "s.sqlite") as store:
        machine_of = {}
        for d in CPU_RUNS + H200_RUNS:
            run_id, _ = store.import_run(d)
            machine_of[run_id] = json.loads((d / "run.json").read_text())["measured"]["machine"]["id"]
        series = history(store, workload="text", target="dohnuts")
    assert {(s.key.machine, s.key.model, s.key.precision, s.key.hwspec) for s in series} == {
        ("cpu-amd-epyc-2cores-1thread", "tiny", "fp32", "none"), ("nvidia-h200", "qwen3.5-2b", "bf16", "h200")}
    for s in series:
        assert {machine_of[p.run_id] for p in s.points} == {s.key.machine} and len(s.points) == 3


def test_interleaved_machines_never_meet(tmp_path):
    """H200 and CPU runs taken in turn (80 ms and 120 ms calls): a series a machine, each flat —
    where one series of both would have alternated and flagged every run."""
    rng = np.random.default_rng(5)
    with RunStore(tmp_path / "s.sqlite") as store:
        for k in range(10):
            where = GPU if k % 2 == 0 else CPU
            _add_run(store, k, (80.0 if where is GPU else 120.0) * math.exp(0.01 * rng.standard_normal()), rng,
                     where=where, within=0.01)
        series = history(store)
        assert [(s.key.machine, len(s.points)) for s in series] == [("cpu-amd-epyc-2cores-1thread", 5),
                                                                     ("nvidia-h200", 5)]
        assert all(s.changes == [] for s in series)
        assert _naive(_samples(store)) == 9  # one series of both: every neighbour a "change"
        only = history(store, machine="nvidia-h200", model="qwen3.5-2b", precision="bf16", hwspec="h200",
                       device="NVIDIA H200")
        assert [s.key.machine for s in only] == ["nvidia-h200"]
        assert history(store, hwspec="none", precision="fp32")[0].key.machine == "cpu-amd-epyc-2cores-1thread"


# ------------------------------------------------------------------------------- the store


SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, started TEXT, git_revision TEXT, git_dirty INTEGER, device TEXT,
    driver TEXT, power_limit_w REAL, hwspec TEXT, versions TEXT, workloads TEXT, run_json TEXT NOT NULL
);
CREATE TABLE records (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, workload TEXT NOT NULL, target TEXT NOT NULL,
    phase TEXT NOT NULL, wall_ms REAL, record TEXT NOT NULL, scenario TEXT, rate_rps REAL, latency_ms REAL,
    correct INTEGER, questions INTEGER, agreement_gap REAL, PRIMARY KEY (run_id, seq)
);
CREATE TABLE summaries (run_id TEXT PRIMARY KEY, summary TEXT NOT NULL);
"""


def test_a_schema_2_store_is_migrated_to_the_series_and_load_columns(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_2)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    meta = {"run_id": "r", "measured": {"machine": {"id": "cpu-acme-2cores-1thread"}}}
    db.execute("INSERT INTO runs (run_id, started, run_json) VALUES ('r', '2026-12-01T00:00:00', ?)",
               (json.dumps(meta),))
    rec = NEUTRAL | {"schema": 1, "workload": {"name": "w"}, "target": "dohnuts", "phase": "steady", "wall_ms": 5.0,
           "aa_half": 1, "model_source": "tiny", "precision": "fp32", "device": {"name": "x86_64", "type": "cpu"},
           "telemetry": [{"load": {"own_cores": 0.5, "others_cores": 1.5, "cpus": 2}},
                         {"load": {"own_cores": 0.7, "others_cores": 1.1, "cpus": 2}}]}
    db.execute("INSERT INTO records (run_id, seq, workload, target, phase, wall_ms, record) VALUES "
               "('r', 0, 'w', 'dohnuts', 'steady', 5.0, ?)", (json.dumps(rec),))
    db.commit()
    db.close()
    with RunStore(path) as store:
        assert store.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
        assert store.db.execute("SELECT machine FROM runs").fetchone() == ("cpu-acme-2cores-1thread",)
        assert store.db.execute("SELECT device, model, precision, aa_half, own_cores, others_cores, cpus "
                                "FROM records").fetchone() == ("x86_64", "tiny", "fp32", 1, 0.6, 1.3, 2)
        assert store.records("r") == [typed(rec)]
        (series,) = history(store)
        assert series.key.context == "cpu-acme-2cores-1thread · x86_64 · tiny · fp32 · none"
        assert store.integrity() == "ok"


# -------------------------------------------------------------------------------- the command


def test_history_on_a_fresh_clone_imports_the_archive_and_prints_a_line_a_series(tmp_path, capsys, monkeypatch):
    """No store yet: `history` builds runs/store.sqlite (beside `run`'s default folder, runs/bench) from
    the committed runs under results/, then prints a heading a machine and a line a series (the tables
    only with --tables), filters by each part of a series' key, and writes JSON with the level shifts."""
    for d in CPU_RUNS[:2] + H200_RUNS[:2]:
        shutil.copytree(d, tmp_path / "results" / d.parent.name / d.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["history"]) == 0
    captured = capsys.readouterr()
    assert "building it from the 4 runs committed under results/" in captured.err
    assert (tmp_path / "runs" / "store.sqlite").is_file() and not (tmp_path / "results" / "store.sqlite").exists()
    lines = captured.out.splitlines()
    headings = [ln for ln in lines if not ln.startswith("  ")]
    assert headings == ["cpu-amd-epyc-2cores-1thread · x86_64 · tiny · fp32 · none",
                        "nvidia-h200 · NVIDIA H200 · qwen3.5-2b · bf16 · h200"]
    assert len(lines) == 2 + 6 + 12  # 6 CPU series (dohnuts, transformers...), 12 on the H200
    assert any(ln.startswith("  text · dohnuts · wall: 2 runs") for ln in lines)
    assert main(["history", "--machine", "nvidia-h200", "--workload", "text", "--target", "dohnuts",
                 "--tables", "--json", str(tmp_path / "h.json")]) == 0
    out = capsys.readouterr().out
    assert "x86_64" not in out and "20261202" in out and "level shift" in out
    data = json.loads((tmp_path / "h.json").read_text())
    (s,) = data["series"]
    assert (s["machine"], s["model"], s["workload"], len(s["points"])) == ("nvidia-h200", "qwen3.5-2b", "text", 2)
    assert all("flagged" in st and "run_id" in st for st in s["steps"])
    assert main(["history", "--machine", "cpu-nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--machine cpu-nope" in err[0] and "nvidia-h200" in err[0]


def test_hostile_names_reach_the_terminal_escaped(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(6)
    path = tmp_path / "s.sqlite"
    with RunStore(path) as store:
        for k in range(2):
            _add_run(store, k, 10.0, rng, workload="evil\x1b[31m[red]x[/red]\n", target="t\x07")
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["history", "--store", str(path), "--tables"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b[31m[red]x[/red]\\n" in out
