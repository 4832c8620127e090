"""Names that identify a workload are unique within a run, and nothing derived from a name (a
trace file, a ranks folder, an inputs folder) can collide (issue 47): two workloads of one name
were pooled into one summary row without a word; at 2 processes each the shared ranks folder was
read twice (36 records for 24 calls); `a b` and `a/b` wrote one trace file; `compare` dropped
`[fp32]` from what it printed."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from tests.bench.test_bench_safety import _small_ceiling_benchmarks  # noqa: F401 (autouse: short ceilings)
from tests.bench.test_compare import _records, _run_dir

WORKLOAD = """\
kind: text
name: {name}
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 2
halfwidth: 0
processes: {processes}
shape: {{requests: 1, questions: 1, seq_tokens: 64, candidates: 2, candidate_tokens: 2}}
"""


def _workload(path: Path, name: str, processes: list[int] = (1,)) -> str:
    path.write_text(WORKLOAD.format(name=json.dumps(name), processes=list(processes)))
    return str(path)


@pytest.mark.parametrize("case", ["two files", "one file twice", "a name as another's at N processes"])
def test_two_workloads_of_one_name_are_refused_naming_both_files(tmp_path, capsys, case):
    a = _workload(tmp_path / "a.yaml", "text", [1, 2] if case.endswith("processes") else [1])
    b = (a if case == "one file twice" else _workload(tmp_path / "b.yaml", "text ×2" if case.endswith("processes")
                                                         else "text"))
    assert main(["run", a, b, "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f"{b}: field 'name'" in err[0] and f"as {a} does" in err[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "store.sqlite").exists()


def test_derived_names_are_one_to_one():
    from dohnuts.bench.store.rundir import derived_name

    names = ["a b", "a/b", "a-b", "a\\b", "a?b", "..", "../..", "", "x" * 300, "x" * 301, "text-2b", "é"]
    derived = [derived_name(n) for n in names]
    assert len(set(derived)) == len(names), derived
    assert derived_name("text-2b") == "text-2b" and derived_name("a-b") == "a-b"  # a safe name stays as it is
    for d in derived:
        assert "/" not in d and d not in (".", "..") and len(d.encode()) <= 100


def test_a_launch_gets_a_folder_of_its_own_and_its_records_are_gathered_once(tmp_path, monkeypatch):
    """Two launches whose names sanitise alike (`a b`, `a/b`) at 2 processes: each gathers its own 2 ranks'
    records once (the ranks append to their files, as dohnuts.bench.measure.worker does: a shared folder was read
    again by the second launch)."""
    from dohnuts.bench.contracts import RunContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts_bench_plugins import launchers
    from dohnuts.bench.sink import RecordSink
    from tests.bench.test_bench_harness import _registry
    from tests.bench.typed_records import NEUTRAL

    calls = 6

    def fake_torchrun(cmd, **kw):  # each rank appends `calls` records to its file, as the worker does
        folder = Path(cmd[cmd.index("--dir") + 1])
        name = load_workload(cmd[cmd.index("--workload") + 1], *_registry()).name
        for rank in range(2):
            with open(folder / f"rank{rank}.jsonl", "a") as f:
                f.writelines(json.dumps(NEUTRAL | {"schema": 2, "workload": {"name": name}, "rank": rank,
                                                   "iteration": i}) + "\n" for i in range(calls))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(launchers.subprocess, "run", fake_torchrun)

    class Sink(RecordSink):  # the records kept in memory
        records: list = []

        def __init__(self):
            super().__init__(io.StringIO())

        def write(self, record):
            self.records.append(record)

    run = RunContext(run_id="r", run_dir=tmp_path / "run", device=None, hwspec=None, console=None)
    sink = Sink()
    for k, name in enumerate(["a b", "a/b"]):
        spec = load_workload(_workload(tmp_path / f"w{k}.yaml", name, [2]), *_registry())
        assert launchers.TorchrunLauncher().launch(run, spec, 2, sink, gpu=False) == 2 * calls
    assert len(sink.records) == 2 * 2 * calls  # 24 records for 24 calls, not 36
    for name in ("a b", "a/b"):
        assert sum(r.workload.name == name for r in sink.records) == 2 * calls
    assert len(list((tmp_path / "run" / "ranks").iterdir())) == 2


def test_names_that_sanitise_alike_write_their_own_trace_files(tmp_path):
    """With --profile, `a b` and `a/b` once wrote one trace file (the second over the first)."""
    from dohnuts.bench.store.rundir import safe_name

    files = [_workload(tmp_path / "w0.yaml", "a b"), _workload(tmp_path / "w1.yaml", "a/b")]
    assert main(["run", *files, "--out", str(tmp_path / "runs"), "--profile", "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    traces = json.loads((run / "run.json").read_text())["traces"]
    assert sorted(t["workload"] for t in traces) == ["a b", "a/b"]
    paths = [t["path"] for t in traces]
    assert len(set(paths)) == 2 and all((run / p).stat().st_size > 0 for p in paths)
    assert len(list((run / "inputs").iterdir())) == 2 and safe_name("a b") == safe_name("a/b")  # their own inputs


def test_compare_keeps_brackets_in_names_and_paths(tmp_path, capsys, monkeypatch):
    """`compare` printed its runs' paths as markup: `[fp32]` vanished from what it showed."""
    monkeypatch.setenv("COLUMNS", "250")
    (tmp_path / "x [fp32]").mkdir()
    a = _run_dir(tmp_path / "x [fp32]", "a", _records(6, seed=1, workload="text [fp32]", target="dohnuts [bold]"))
    b = _run_dir(tmp_path, "b", _records(6, seed=2, workload="text [fp32]", target="dohnuts [bold]"))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"A = {a / 'results.jsonl'}" in " ".join(out.split()) and "text [fp32]" in out and "dohnuts [bold]" in out
