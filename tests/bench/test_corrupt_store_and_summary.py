"""A store or a summary that lies (issue 47): every store and summary read is typed, anything corrupt
is one line naming the file (exit status 2, never a traceback), a `run` into a store it cannot fill is
refused before it measures, reads open the store read-only, and a misspelled --stage names the
stages there are."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.store.run_store import APPLICATION_ID, RunStore
from tests.bench.test_compare import _records, _run_dir
from tests.bench.test_serving_store import OLD, V1
from tests.hostile import SMALL_TEXT_WORKLOAD, one_error_line

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-standard-suite"
WORKLOAD = SMALL_TEXT_WORKLOAD


_one_line = one_error_line


def _store(tmp_path: Path) -> Path:
    """A store holding one run of synthetic records (stages prefix and suffix)."""
    path = tmp_path / "store.sqlite"
    with RunStore(path) as store:
        store.import_run(_run_dir(tmp_path, "a", _records(6, seed=1)))
        store.import_run(_run_dir(tmp_path, "b", _records(6, seed=2)))
    return path


def _edit(path: Path, *statements: str) -> list[str]:
    db = sqlite3.connect(path)
    for sql in statements:
        db.execute(sql)
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return _content(path)


def _content(path: Path) -> list[str]:
    """What a store holds, as SQL (read without changing it)."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return list(db.iterdump())
    finally:
        db.close()


CORRUPTIONS = {
    "schema version not a number": (("UPDATE meta SET value = 'three' WHERE key = 'schema_version'",),
                                    "has a schema version of 'three', not a whole number"),
    "renamed column": (("ALTER TABLE records RENAME COLUMN wall_ms TO wall_time",),
                       "table records lacks column(s) wall_ms"),
    "dropped table": (("DROP TABLE summaries",), "no table summaries"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_store_is_one_line_for_history(tmp_path, capsys, case):
    statements, why = CORRUPTIONS[case]
    path = _store(tmp_path)
    before = _edit(path, *statements)
    assert main(["history", "--store", str(path)]) == 2
    _one_line(capsys, str(path), why)
    assert _content(path) == before


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_run_into_a_corrupt_store_is_refused_before_it_measures(tmp_path, capsys, monkeypatch, case):
    """A `run` into a store with a renamed column once measured everything, then crashed with no report."""
    from dohnuts.bench.measure import runner

    def never(*args, **kw):
        raise AssertionError("measured into a store it cannot fill")

    monkeypatch.setattr(runner, "measure_workload", never)
    statements, why = CORRUPTIONS[case]
    path = _store(tmp_path)
    before = _edit(path, *statements)
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    assert main(["run", str(tmp_path / "w.yaml"), "--out", str(tmp_path / "runs"), "--store", str(path),
                 "--quiet"]) == 2
    _one_line(capsys, str(path), why)
    assert not (tmp_path / "runs").exists() and _content(path) == before


@pytest.mark.parametrize("edit, why", [
    ("UPDATE records SET record = '{not json' WHERE seq = 2", "holds record 2 of run a, which is not a JSON object"),
    ("UPDATE records SET record = '[1, 2]' WHERE seq = 2", "holds record 2 of run a, which is not a JSON object"),
    ("UPDATE records SET wall_ms = 'fast' WHERE seq = 2", "field 'record 2 of run a.wall_ms'"),
    ("UPDATE records SET record = json_set(record, '$.stages.prefix.host_ms', 'slow') WHERE seq = 2",
     "field 'record 2 of run a: stages.prefix.host_ms'"),
])
def test_a_record_the_store_cannot_read_is_one_line(tmp_path, capsys, edit, why):
    path = _store(tmp_path)
    _edit(path, edit)
    assert main(["history", "--store", str(path), "--stage", "prefix"]) == 2
    _one_line(capsys, str(path), why)


def test_a_bad_record_during_the_schema_1_migration_is_one_line_and_changes_nothing(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute("INSERT INTO runs (run_id, run_json) VALUES ('r', '{}')")
    db.execute("INSERT INTO records VALUES ('r', 0, 'w', 'dohnuts', 'steady', 5.0, ?)", (json.dumps(OLD),))
    db.execute("INSERT INTO records VALUES ('r', 1, 'w', 'dohnuts', 'steady', 5.0, '{cut')")
    db.commit()
    db.close()
    before = _content(path)
    assert main(["store", "import", str(_run_dir(tmp_path, "a", _records(3))), "--store", str(path)]) == 2
    _one_line(capsys, str(path), "holds record 1 of run r, which is not a JSON object", "cannot be migrated")
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)  # rolled back
    assert [r[1] for r in db.execute("PRAGMA table_info(records)")][-1] == "record"
    db.close()
    assert main(["history", "--store", str(path)]) == 2  # read only: not migrated, said so
    _one_line(capsys, "has schema version 1, older than this dohnuts reads")
    assert _content(path) == before


@pytest.fixture
def read_only_stores(monkeypatch):
    """Every store opened as the kernel opens a read-only file for an ordinary user: SQLite may read it,
    never write it. The tests run as root, who writes even a 0444 file, so a writable open is made
    read-only here (as an ordinary user the file's mode alone does it). With `folder=True` the folder is
    read-only too: SQLite cannot make the `-shm` a WAL store's reader needs (it says "unable to open")."""
    from dohnuts.bench.store import run_store as store_module

    real = sqlite3.connect

    def apply(folder: bool = False):
        def connect(database, *args, **kw):
            if not kw.get("uri"):
                database, kw = f"{Path(database).resolve().as_uri()}?mode=ro", {**kw, "uri": True}
            if folder and "immutable=1" not in database:
                raise sqlite3.OperationalError("unable to open database file")
            return real(database, *args, **kw)

        monkeypatch.setattr(store_module.sqlite3, "connect", connect)

    return apply


@pytest.mark.parametrize("folder", [False, True], ids=["read-only file", "read-only folder"])
def test_history_and_report_read_a_read_only_store(tmp_path, capsys, read_only_stores, folder, reportable):
    """`history` and `report --html` refused a read-only store they only read."""
    path = _store(tmp_path)
    _edit(path)  # the write-ahead log folded into the file: what a copied or committed store looks like
    os.chmod(path, 0o444)
    read_only_stores(folder)
    before = path.read_bytes()
    try:
        assert main(["history", "--store", str(path), "--tables"]) == 0
        assert "w · dohnuts · wall" in capsys.readouterr().out
        run = tmp_path / "run"
        shutil.copytree(reportable, run)  # a run with its summary.json, analysed once for the module
        capsys.readouterr()
        assert main(["report", str(run), "--html", "--store", str(path)]) == 0
        assert (run / "report.html").is_file()
    finally:
        os.chmod(path, 0o644)
    assert path.read_bytes() == before


def test_a_misspelled_stage_names_the_stages_there_are(tmp_path, capsys):
    """A misspelled --stage once said the store "holds no steady-state records"."""
    path = _store(tmp_path)
    assert main(["history", "--store", str(path), "--stage", "prefx"]) == 2
    _one_line(capsys, "field '--stage'", "is not a stage", "stages: wall, prefix, suffix")
    assert main(["history", "--store", str(path), "--stage", "prefix"]) == 0


@pytest.fixture(scope="module")
def reportable(tmp_path_factory) -> Path:
    """The committed CPU run with the summary.json `analyze` derives from it (the tests copy it)."""
    tmp = tmp_path_factory.mktemp("reportable")
    run = tmp / "run"
    shutil.copytree(FIXTURE, run)
    assert main(["analyze", str(run), "--out", str(tmp / "derived")]) == 0
    shutil.copy(tmp / "derived" / "summary.json", run / "summary.json")
    return run


def _hand_edit_calls(s):
    s["summary"][0]["calls"] = "many"


def _hand_edit_no_workload(s):
    del s["summary"][0]["workload"]


def _hand_edit_stages(s):
    s["summary"][0]["stages"] = ["prefix"]


def _hand_edit_section(s):
    s["sections"]["efficiency"]["groups"] = [{"workload": "w"}]


def _hand_edit_list(s):
    s.clear()
    s["summary"] = {"not": "a list"}


@pytest.mark.parametrize("edit, why", [
    (_hand_edit_calls, "field 'summary[0].calls'"), (_hand_edit_no_workload, "field 'summary[0].workload'"),
    (_hand_edit_stages, "field 'summary[0].stages'"), (_hand_edit_list, "field 'summary'"),
    (_hand_edit_section, "cannot be rendered"),
], ids=["calls", "workload", "stages", "summary", "section"])
def test_a_hand_edited_summary_is_one_line_for_report_html(reportable, tmp_path, capsys, edit, why):
    """A hand-edited summary.json once gave `report --html` a TypeError or a KeyError."""
    run = tmp_path / "run"
    shutil.copytree(reportable, run)
    summary = json.loads((run / "summary.json").read_text())
    edit(summary)
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run), "--html", "--store", str(tmp_path / "none.sqlite")]) == 2
    _one_line(capsys, str(run / "summary.json"), why)
    assert not (run / "report.html").exists()


def test_a_hand_edited_run_json_is_one_line_for_report_and_import(reportable, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reportable, run)
    meta = json.loads((run / "run.json").read_text())
    meta["traces"] = [["not", "an", "entry"]]
    (run / "run.json").write_text(json.dumps(meta))
    assert main(["report", str(run), "--html", "--store", str(tmp_path / "none.sqlite")]) == 2
    _one_line(capsys, str(run / "run.json"), "field 'traces[0]'")
    assert main(["store", "import", str(run), "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "field 'traces[0]'" in capsys.readouterr().err
