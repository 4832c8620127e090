"""The harness's launcher (issue 14): a workload's `processes: [1, 2]` measured by torchrun's gloo
processes on the CPU — every rank's records in the run's JSONL, a 2-process train step that
computes exactly the updates one process computes, the scaling section, the all-reduce stage
bounded by the interconnect, a killed rank reported as a failure with every record kept — and
the scaling arithmetic and interconnect bounds against hand computations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from dohnuts.bench.analysis.cost import Work, allreduce_cost
from dohnuts.bench.analysis.scaling import scaling_rows, scaling_table
from dohnuts.bench.cli import main
from tests.bench.typed_records import typed

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"kind": "train-step", "model": "tiny", "warmup": 1, "repeat": 3, "halfwidth": 0, "processes": [1, 2],
         "shape": {"requests": 8, "questions": 2, "seq_tokens": 64, "candidates": 2, "candidate_tokens": 2}}
TEXT = {"kind": "text", "model": "tiny", "warmup": 1, "repeat": 3, "halfwidth": 0, "processes": [1, 2],
        "shape": {"requests": 4, "questions": 2, "seq_tokens": 64, "candidates": 2, "candidate_tokens": 2}}


def _bench(tmp_path: Path, *workloads: dict, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    files = []
    for i, w in enumerate(workloads):
        f = tmp_path / f"w{i}-{w['kind']}.yaml"
        f.write_text(yaml.safe_dump(w))
        files.append(str(f))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "dohnuts.bench.cli", "run", *files, "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, COLUMNS="120", OMP_NUM_THREADS="1", **(env or {})))
    runs = sorted(out.iterdir()) if out.exists() else []
    return proc, (runs[-1] if runs else out)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_process_run(made_once):
    def make(folder):
        proc, _ = _bench(folder, TRAIN, TEXT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    (run,) = sorted((made_once("two-process-run", make) / "runs").iterdir())
    return run, _records(run)


@pytest.mark.slow
def test_every_rank_records_in_the_run(two_process_run):
    run, records = two_process_run
    seen = defaultdict(int)
    for r in records:
        seen[(r["workload"]["kind"], r["world_size"], r["rank"], r["phase"])] += 1
    for kind in ("train-step", "text"):
        assert seen[(kind, 1, 0, "steady")] == 3
        assert seen[(kind, 2, 0, "steady")] == seen[(kind, 2, 1, "steady")] == 3  # the ranks agree on counts
        assert seen[(kind, 2, 0, "first-call")] == seen[(kind, 2, 1, "first-call")] == 1
    assert {r["shard"] for r in records if r["workload"]["kind"] == "train-step"} == {"collective"}
    assert {r["shard"] for r in records if r["workload"]["kind"] == "text"} == {"data"}
    meta = json.loads((run / "run.json").read_text())
    busbw = meta["measured"]["ceilings"]["allreduce_busbw"]
    assert busbw["value"] > 0 and busbw["processes"] == 2 and busbw["backend"] == "gloo"
    assert meta["failures"] == []


def test_two_process_train_step_computes_the_one_process_updates(two_process_run):
    """The same updates (warm-up then measured, from the same seeded model): the loss of every
    update is the same on one process and on both ranks of two (the all-reduced average)."""
    _, records = two_process_run
    loss = defaultdict(dict)
    for r in records:
        if r["workload"]["kind"] == "train-step" and r["phase"] == "steady":
            loss[(r["world_size"], r["rank"])][r["iteration"]] = r["extra"]["loss"]
    assert loss[(2, 0)] == loss[(2, 1)]  # identical on the ranks: one all-reduce, identical steps
    for i, one in loss[(1, 0)].items():
        assert loss[(2, 0)][i] == pytest.approx(one, rel=1e-5, abs=1e-6)
    steady2 = [r for r in records if r["workload"]["kind"] == "train-step" and r["world_size"] == 2
               and r["phase"] == "steady"]
    assert all("allreduce" in r["stages"] and r["extra"]["allreduce_bytes"] > 0 for r in steady2)
    # each rank ran 2 of the update's 4 microbatches
    assert all(len(r["work"]["microbatches"]) == 2 for r in steady2)


def test_text_requests_are_sharded_across_ranks(two_process_run):
    """Data parallelism: rank r takes calls r, r + 2, ...; over the measured calls the two ranks
    never score the same request at the same iteration (request ids differ by their text)."""
    _, records = two_process_run
    by_rank = defaultdict(list)
    for r in records:
        if r["workload"]["kind"] == "text" and r["world_size"] == 2 and r["phase"] == "steady":
            by_rank[r["rank"]].append(r)
    assert len(by_rank[0]) == len(by_rank[1]) == 3


def test_scaling_section_and_plot(two_process_run):
    run, _ = two_process_run
    summary = json.loads((run / "summary.json").read_text())
    rows = {(r["workload"].split("-")[-1], r["processes"]): r for r in summary["sections"]["scaling"]["rows"]}
    assert rows[("step", 1)]["speedup"] == pytest.approx(1.0) and rows[("step", 1)]["unit"] == "update"
    assert rows[("text", 2)]["unit"] == "request" and rows[("text", 2)]["speedup"] > 0
    assert rows[("step", 2)]["allreduce_ms"] is not None
    assert (run / "scaling.png").stat().st_size > 0
    report = (run / "report.txt").read_text()
    assert "Scaling" in report and "×2" in report  # the 2-process groups are their own rows
    group = next(g for g in summary["sections"]["efficiency"]["groups"] if g["workload"].endswith("×2") and "train" in g["workload"]
                 and g["target"] == "dohnuts")
    allreduce = next(s for s in group["stages"] if s["stage"] == "allreduce")
    assert allreduce["resource"] == "interconnect" and allreduce["bound_ms"]["measured"] > 0
    assert "allreduce_busbw_this_run" in allreduce["limiter"]["measured"]


@pytest.mark.slow
def test_a_killed_rank_is_a_failure_and_every_record_stays(tmp_path):
    proc, run = _bench(tmp_path, TRAIN, env={"DOHNUTS_BENCH_FAULT_EXIT": "rank=1,call=1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 1 failed (exit code 17)" in proc.stderr
    meta = json.loads((run / "run.json").read_text())
    assert len(meta["failures"]) == 1 and "2 processes: rank 1 failed" in meta["failures"][0]["error"]
    records = _records(run)  # every line valid JSON
    assert sum(r["world_size"] == 1 and r["phase"] == "steady" for r in records) == 3
    assert any(r["world_size"] == 2 for r in records)  # what the ranks completed is kept
    assert (run / "report.txt").exists()


# -- validation ---------------------------------------------------------------------------------


def _refused(tmp_path: Path, workload: dict, capsys) -> str:
    """`dohnuts-bench run` of `workload`, called in this process (a refusal starts no process):
    exit status 2, and the one line it wrote to stderr."""
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(workload))
    capsys.readouterr()
    assert main(["run", str(f), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("value, message", [(0, "process count in 1..1024"), ([1, 1], "lists 1 twice"),
                                            ("two", "process count"), ([], "at least one"), (True, "process count")])
def test_bad_process_counts_are_refused(tmp_path, capsys, value, message):
    err = _refused(tmp_path, TEXT | {"processes": value}, capsys)
    assert "field 'processes'" in err and message in err


def test_an_unknown_launcher_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, TEXT | {"launcher": "mpirun"}, capsys)
    assert "field 'launcher'" in err and "torchrun" in err


def test_more_processes_than_gpus_are_skipped(monkeypatch):
    import torch

    from dohnuts_bench_plugins.launchers import TorchrunLauncher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    launcher = TorchrunLauncher()
    assert launcher.unavailable(2, torch.device("cuda")) is None
    assert launcher.unavailable(4, torch.device("cuda")) == "needs 4 GPUs, this machine has 2"
    assert launcher.unavailable(4, torch.device("cpu")) is None  # gloo processes share the CPU


# -- arithmetic ---------------------------------------------------------------------------------


def _rec(world, rank, iteration, wall, shard, allreduce=None, decisions=4, phase="steady", extra=None):
    stages = {"forward": {"host_ms": wall, "device_ms": None, "count": 1}}
    if allreduce is not None:
        stages["allreduce"] = {"host_ms": allreduce, "device_ms": None, "count": 1}
    return typed({"workload": {"name": "w"}, "target": "t", "world_size": world, "rank": rank, "iteration": iteration,
                  "wall_ms": wall, "shard": shard, "stages": stages, "decisions": decisions, "phase": phase,
                  "extra": extra or {}})


def test_scaling_of_collective_calls_by_hand():
    recs = [_rec(1, 0, i, 100.0, "collective") for i in range(3)]
    # two ranks: update i ends with the slower rank; rank 1 waits 10 ms less in the all-reduce
    recs += [_rec(2, 0, i, 60.0, "collective", allreduce=15.0) for i in range(3)]
    recs += [_rec(2, 1, i, 62.0, "collective", allreduce=5.0) for i in range(3)]
    one, two = scaling_rows(recs)
    assert one.per_s == pytest.approx(10.0) and one.speedup == pytest.approx(1.0)
    assert two.per_s == pytest.approx(1e3 / 62.0)
    assert two.speedup == pytest.approx(100.0 / 62.0) and two.efficiency == pytest.approx(50.0 / 62.0)
    assert two.decisions_per_s == pytest.approx(8 * 1e3 / 62.0)  # both ranks' questions make one update
    assert two.allreduce_ms == pytest.approx(10.0)
    assert two.imbalance_ms == pytest.approx((62.0 - 5.0) - (60.0 - 15.0))


def test_scaling_of_data_parallel_calls_by_hand():
    recs = [_rec(1, 0, i, 50.0, "data") for i in range(3)]
    recs += [_rec(2, 0, i, 50.0, "data") for i in range(3)] + [_rec(2, 1, i, 40.0, "data") for i in range(3)]
    times = {"latency_ms": 1.0, "queue_ms": 0.0}
    stream = {"stream": times | {"total_ms": 200.0}}
    recs += [_rec(2, r, i, 1.0, "data", phase="stream", extra={"stream": times | {"total_ms": 150.0 + 50 * r}})
             for r in range(2) for i in range(4)]
    recs += [_rec(1, 0, i, 1.0, "data", phase="stream", extra=stream) for i in range(4)]
    one, two = scaling_rows(recs)
    assert two.per_s == pytest.approx(1e3 / 50 + 1e3 / 40)
    assert two.speedup == pytest.approx((1e3 / 50 + 1e3 / 40) / 20.0)
    assert two.imbalance_ms == pytest.approx(10.0)
    assert one.stream_per_s == pytest.approx(4 / 200.0 * 1e3)
    assert two.stream_per_s == pytest.approx(8 / 200.0 * 1e3)  # the slower rank's stream sets the time
    assert scaling_table([one, two]).rows  # renders


def test_one_process_records_have_no_scaling_section():
    assert scaling_rows([_rec(1, 0, i, 10.0, "data") for i in range(3)]) == []


def test_allreduce_bound_by_hand():
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.bounds import work_bound

    cost = allreduce_cost(100e6, 4)  # a ring sends 2·3/4 of 100 MB per device
    assert cost.useful.interconnect_bytes == pytest.approx(150e6) and cost.resource == "interconnect"
    assert allreduce_cost(100e6, 1).useful.interconnect_bytes == 0.0
    spec = find_hwspec("h200")
    b = work_bound(cost.useful, spec, "bf16", "datasheet", "allreduce")
    assert b.ms == pytest.approx(150e6 / 450e9 * 1e3) and b.limiter == "bandwidth" and b.ceiling == "nvlink4"
    # a spec without an interconnect leaves the stage unbounded (and the analysis warns)
    rx = find_hwspec("rx7900xtx")
    assert not rx.has_role("interconnect", "bf16")
    assert work_bound(Work(interconnect_bytes=1e9), rx, "bf16").limiter == "none"


def test_measured_allreduce_becomes_the_measured_interconnect():
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    spec = with_measured_ceilings(find_hwspec("h200"), {"allreduce_busbw": {"value": 300e9, "kind": "bandwidth"}})
    assert spec.ceiling("interconnect", "bf16", "measured").value == 300e9
    assert spec.ceiling("interconnect", "bf16", "datasheet").name == "nvlink4"
