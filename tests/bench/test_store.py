"""The run store (dohnuts.bench.store.run_store) and history across commits (dohnuts.bench.store.history): the
store holds exactly what the JSONL holds, imports committed runs, survives concurrent writers,
refuses corrupt and foreign files in one line, and history flags a real step but not noise."""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import random
import sqlite3
from pathlib import Path

import pytest

from dohnuts.bench.analysis.records import encode_record, read_records
from dohnuts.bench.cli import main
from dohnuts.bench.store.history import history
from dohnuts.bench.store.run_store import RunStore, StoreError
from tests.bench.typed_records import typed, typed_all

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "bench" / "fixtures" / "h200-ab-after"  # a committed H200 run (gzipped JSONL)


def _lines(path: Path) -> list[dict]:
    """The records of a results.jsonl[.gz] exactly as written."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _summary_of(records, tmp_path, name):
    """The summary the analysis writes for these records (through the JSONL, as `analyze` does)."""
    from dohnuts.bench.commands.analyze import analyze_and_report
    from dohnuts.bench.report.terminal import stdout_console

    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(encode_record(r) + "\n" for r in records))
    out = tmp_path / name
    out.mkdir()
    analyze_and_report(path, None, {}, out, stdout_console())
    return json.loads((out / "summary.json").read_text())["summary"]


def test_a_run_round_trips_through_the_store(tmp_path):
    """JSONL → store → the same records (a schema-1 run: as the reader upgrades them), and the same
    summary from either."""
    with RunStore(tmp_path / "s.sqlite") as store:
        run_id, n = store.import_run(COMMITTED)
        want = read_records(COMMITTED / "results.jsonl.gz")
        got = store.records(run_id)
        assert n == len(want) == len(got) and got == want
        (run,) = store.runs()
        assert run["run_id"] == run_id and run["revision"] and run["dirty"] is not None and run["hwspec"]
        assert store.integrity() == "ok"
    assert _summary_of(got, tmp_path, "store") == _summary_of(want, tmp_path, "jsonl")


@pytest.mark.slow
def test_a_run_writes_the_store_as_it_goes(tmp_path):
    """`dohnuts-bench run` puts its run, every record and its summary into the store (by default
    store.sqlite beside the --out folder)."""
    store_path = tmp_path / "store.sqlite"
    assert main(["run", str(ROOT / "workloads" / "text.yaml"), "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    with RunStore(store_path) as store:
        (run,) = store.runs()
        # the line the store holds is the line results.jsonl holds
        assert [json.loads(encode_record(r)) for r in store.records(run["run_id"])] == _lines(run_dir / "results.jsonl")
        assert store.summary(run["run_id"]) == json.loads((run_dir / "summary.json").read_text())


def _writer(path: str, run_id: str, n: int) -> None:
    with RunStore(path) as store:
        store.add_run(run_id, {"run_id": run_id})
        for i in range(n):
            store.add_records(run_id, [typed({"run_id": run_id, "wall_ms": i})])


def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "s.sqlite")
    RunStore(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, f"run{k}", 150)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with RunStore(path) as store:
        assert store.integrity() == "ok"
        for k in range(2):
            assert [r.wall_ms for r in store.records(f"run{k}")] == list(range(150))


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_store_is_one_line(tmp_path, capsys, content):
    bad = tmp_path / "s.sqlite"
    bad.write_bytes(content)
    with pytest.raises(StoreError, match="is not a dohnuts run store"):
        RunStore(bad)
    assert main(["history", "--store", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0]


def test_a_foreign_sqlite_file_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(StoreError, match="of something else"):
        RunStore(other)
    assert other.read_bytes()[:16] == b"SQLite format 3\x00"  # and left as it was


def _run_records(run_id: str, rev: str, wall: float, rng: random.Random, calls: int = 12) -> tuple[dict, list]:
    meta = {"run_id": run_id, "provenance": {"git": rev}}
    recs = typed_all([{"schema": 1, "run_id": run_id, "workload": {"name": "text-2b"}, "target": "dohnuts",
                       "phase": "steady", "aa_half": i % 2, "wall_ms": wall * rng.gauss(1.0, 0.01),
                       "stages": {"forward": {"device_ms": 0.9 * wall * rng.gauss(1.0, 0.01), "host_ms": 0.0}}}
                      for i in range(calls)])
    return meta, recs


def test_history_flags_the_injected_step_and_nothing_else(tmp_path):
    """Six revisions of one workload, 1 % noise, the wall time doubled from the fourth on: history
    flags exactly one level shift, at revision 4, as slower, on the whole call and on the stage."""
    rng = random.Random(0)
    with RunStore(tmp_path / "s.sqlite") as store:
        for k in range(6):
            run_id = f"2026120{k + 1}-120000-r{k}"
            meta, recs = _run_records(run_id, f"rev{k:02d}", 20.0 if k >= 3 else 10.0, rng)
            store.add_run(run_id, meta)
            store.add_records(run_id, recs)
        for stage in ("wall", "forward"):
            (series,) = history(store, stage=stage)
            assert [p.revision for p in series.points] == [f"rev{k:02d}" for k in range(6)]
            assert [(series.points[c.at].revision, c.verdict) for c in series.changes] == [("rev03", "slower")]
            (step,) = series.changes
            assert (step.runs_before, step.runs_after) == (3, 3) and step.ratio == pytest.approx(2.0, rel=0.05)


def test_history_command_on_a_store(tmp_path, capsys):
    with RunStore(tmp_path / "s.sqlite") as store:
        store.import_run(COMMITTED)
    assert main(["history", "--store", str(tmp_path / "s.sqlite"), "--workload", "ab-text-2b",
                 "--json", str(tmp_path / "h.json")]) == 0
    out = json.loads((tmp_path / "h.json").read_text())
    assert {s["target"] for s in out["series"]} == {"dohnuts"} and out["series"][0]["points"][0]["calls"] >= 10


def test_an_archived_run_is_what_the_store_imports(tmp_path, capsys):
    """`store archive` copies run.json and the records gzipped reproducibly (two archives of one run
    are byte-identical); the store imports the archive to the same records; an existing archive is
    never overwritten, a folder that is no run is one line."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_bytes((COMMITTED / "run.json").read_bytes())
    with gzip.open(COMMITTED / "results.jsonl.gz", "rb") as f:
        (run / "results.jsonl").write_bytes(f.read())
    (run / "report.txt").write_text("derived")
    assert main(["store", "archive", str(run), str(tmp_path / "a")]) == 0
    assert main(["store", "archive", str(run), str(tmp_path / "b")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["results.jsonl.gz", "run.json"]
    assert (tmp_path / "a" / "results.jsonl.gz").read_bytes() == (tmp_path / "b" / "results.jsonl.gz").read_bytes()
    with RunStore(tmp_path / "s.sqlite") as store:
        run_id, n = store.import_run(tmp_path / "a")
        assert store.records(run_id) == read_records(COMMITTED / "results.jsonl.gz")
    capsys.readouterr()
    assert main(["store", "archive", str(run), str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never overwritten" in err[0]
    assert main(["store", "archive", str(tmp_path / "nothing"), str(tmp_path / "c")]) == 2
