"""Every command that writes follows the one output rule (dohnuts.schema.output_paths): never through
a planted symbolic link, never onto one of its own inputs, never into a run folder; a refusal is one
line before any work and leaves every file as it was (issue 47, output paths)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.store.run_store import RunStore
from tests.bench.test_compare import _records, _run_dir
from tests.hostile import SMALL_TEXT_WORKLOAD, one_error_line

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-standard-suite"  # a committed run folder
WORKLOAD = SMALL_TEXT_WORKLOAD


_one_line = one_error_line


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def committed_run(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    return run


@pytest.mark.parametrize("name", ["report.txt", "roofline.png", "summary.json"])
def test_analyze_never_writes_through_a_link_planted_in_its_out_folder(committed_run, tmp_path, capsys, name):
    """`analyze RUN --out DIR` once wrote report.txt and roofline.png through links planted in DIR,
    overwriting the files they pointed to."""
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    out = tmp_path / "reports"
    out.mkdir()
    (out / name).symlink_to(victim)
    assert main(["analyze", str(committed_run), "--out", str(out)]) == 2
    _one_line(capsys, str(out), "field '--out'", f"holds the symbolic link '{name}'")
    assert victim.read_text() == "precious\n" and sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("spelling", ["the run", "another spelling"])
def test_analyze_never_writes_into_a_run_folder(committed_run, capsys, spelling):
    """`analyze RUN --out RUN` once rewrote a committed run's summary and reports."""
    before = _snapshot(committed_run)
    (committed_run.parent / "sub").mkdir()
    out = committed_run if spelling == "the run" else committed_run.parent / "sub" / ".." / "run"
    assert main(["analyze", str(committed_run), "--out", str(out)]) == 2
    _one_line(capsys, "field '--out'", "is in the run folder")
    assert _snapshot(committed_run) == before


def _reportable_run(committed_run: Path, tmp_path: Path) -> Path:
    """The committed run with a summary.json, as `report --html` reads it."""
    assert main(["analyze", str(committed_run), "--out", str(tmp_path / "analysed")]) == 0
    shutil.copy(tmp_path / "analysed" / "summary.json", committed_run / "summary.json")
    return committed_run


def test_report_never_writes_over_its_inputs_or_beside_a_run(committed_run, tmp_path, capsys):
    """`report --out RUN/results.jsonl` once replaced the records with HTML."""
    run = _reportable_run(committed_run, tmp_path)
    capsys.readouterr()
    before = _snapshot(run)
    for name, why in [("results.jsonl.gz", "is an input of this command"), ("run.json", "is an input of this command"),
                      ("summary.json", "is an input of this command"), ("page.html", "is in the run folder")]:
        assert main(["report", str(run), "--html", "--out", str(run / name)]) == 2
        _one_line(capsys, "field '--out'", why)
    assert _snapshot(run) == before
    store = tmp_path / "store.sqlite"
    RunStore(store).close()
    assert main(["report", str(run), "--html", "--store", str(store), "--out", str(store)]) == 2
    _one_line(capsys, "is an input of this command")
    assert main(["report", str(run), "--html"]) == 0  # its own page, RUN/report.html, is the one file it writes
    assert set(_snapshot(run)) == set(before) | {"report.html"}


@pytest.mark.parametrize("how", ["results", "hard link", "run.json"])
def test_compare_json_never_replaces_its_input(tmp_path, capsys, how):
    """`compare A B --json B/results.jsonl` once replaced the records with the comparison."""
    import os

    a = _run_dir(tmp_path, "a", _records(5, seed=1))
    b = _run_dir(tmp_path, "b", _records(5, seed=2))
    out = {"results": b / "results.jsonl", "hard link": tmp_path / "hard.json", "run.json": a / "run.json"}[how]
    if how == "hard link":
        os.link(b / "results.jsonl", out)
    before = {**_snapshot(a), **{f"b/{k}": v for k, v in _snapshot(b).items()}}
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 2
    _one_line(capsys, "field '--json'", "is an input of this command")
    assert {**_snapshot(a), **{f"b/{k}": v for k, v in _snapshot(b).items()}} == before
    assert main(["compare", str(a), str(b), "--json", str(a / "cmp.json")]) == 2  # beside a run: refused too
    _one_line(capsys, "is in the run folder")


@pytest.mark.parametrize("name", ["store.sqlite", "store.sqlite-wal"])
def test_history_json_never_overwrites_the_store(tmp_path, capsys, name):
    """`history --json STORE` once overwrote the store it had just read."""
    run = _run_dir(tmp_path, "a", _records(6, seed=1))
    store = tmp_path / "store.sqlite"
    with RunStore(store) as s:
        s.import_run(run)
    before = store.read_bytes()
    assert main(["history", "--store", str(store), "--json", str(tmp_path / name)]) == 2
    _one_line(capsys, "field '--json'", "is an input of this command")
    assert store.read_bytes() == before
    assert main(["history", "--store", str(store), "--json", str(tmp_path / "h.json")]) == 0


@pytest.mark.parametrize("bad", ["a file", "below a file", "a run folder"])
def test_a_run_refused_for_its_out_creates_nothing(tmp_path, capsys, committed_run, bad):
    """A `run` refused for a bad --out once still created an empty store.sqlite beside it."""
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    (tmp_path / "taken").write_text("a file\n")
    out = {"a file": tmp_path / "taken", "below a file": tmp_path / "taken" / "runs",
           "a run folder": committed_run}[bad]
    before = sorted(p.name for p in tmp_path.iterdir())
    run_before = _snapshot(committed_run)
    assert main(["run", str(tmp_path / "w.yaml"), "--out", str(out), "--quiet"]) == 2
    _one_line(capsys, "field '--out'")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and _snapshot(committed_run) == run_before


def test_run_store_and_output_follow_the_rule(tmp_path, capsys):
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    (tmp_path / "link.sqlite").symlink_to(victim)
    args = ["run", str(tmp_path / "w.yaml"), "--out", str(tmp_path / "runs"), "--quiet"]
    assert main([*args, "--store", str(tmp_path / "link.sqlite")]) == 2
    _one_line(capsys, "field '--store'", "is a symbolic link")
    assert main([*args, "--output", str(tmp_path / "w.yaml")]) == 2  # its own workload file
    _one_line(capsys, "field '--output'", "is an input of this command")
    assert victim.read_text() == "precious\n" and not (tmp_path / "runs").exists()
    assert not (tmp_path / "store.sqlite").exists()


def test_store_archive_and_import_follow_the_rule(committed_run, tmp_path, capsys):
    before = _snapshot(committed_run)
    (tmp_path / "empty").mkdir()
    (tmp_path / "dest").symlink_to(tmp_path / "empty", target_is_directory=True)
    assert main(["store", "archive", str(committed_run), str(tmp_path / "dest")]) == 2
    _one_line(capsys, "is a symbolic link")
    assert not any((tmp_path / "empty").iterdir())
    assert main(["store", "import", str(committed_run), "--store", str(committed_run / "run.json")]) == 2
    _one_line(capsys, "field '--store'", "is an input of this command")
    assert _snapshot(committed_run) == before


def test_predict_never_writes_through_a_link(tmp_path, capsys):
    from dohnuts.cli import main as dohnuts_main

    src = tmp_path / "requests.jsonl"
    src.write_text('{"id": "r1", "questions": [{"id": "q1", "text": "Which?", "candidates": ["a", "b"]}]}\n')
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    (tmp_path / "out.jsonl").symlink_to(victim)
    assert dohnuts_main(["predict", "--model", "tiny", str(src), "-o", str(tmp_path / "out.jsonl")]) == 2
    _one_line(capsys, "field '-o'", "is a symbolic link")
    assert victim.read_text() == "precious\n"
