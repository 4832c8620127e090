"""The one output rule (dohnuts.schema.output_paths) and the writers behind it: an output is never a
symbolic link, one of its command's inputs (by any path) or in a run folder, and the writers replace
a link planted after the check rather than follow it (issue 47)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dohnuts.errors import DohnutsError
from dohnuts.schema import (
    JsonlFile, check_output_file, check_output_folder, is_run_folder, write_bytes_atomic, write_json,
    write_text_atomic,
)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    return victim


def _run_folder(tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "results.jsonl").write_text("{}\n")
    return run


@pytest.mark.parametrize("write", [
    lambda p: write_text_atomic(p, "new"),
    lambda p: write_bytes_atomic(p, b"new"),
    lambda p: write_json(p, {"new": 1}),
], ids=["text", "bytes", "json"])
def test_the_atomic_writers_replace_a_planted_link_and_never_follow_it(tmp_path, write):
    victim = _victim(tmp_path)
    link = tmp_path / "out"
    link.symlink_to(victim)
    write(link)
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and "new" in link.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "precious.txt"]  # no temporary file left


def test_a_jsonl_file_refuses_a_planted_link(tmp_path):
    victim = _victim(tmp_path)
    link = tmp_path / "out.jsonl"
    link.symlink_to(victim)
    with pytest.raises(DohnutsError, match="is a symbolic link"):
        JsonlFile(link, truncate=True)
    assert victim.read_text() == "precious\n"


def test_a_link_is_refused_as_an_output_file_and_in_an_output_folder(tmp_path):
    victim = _victim(tmp_path)
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    with pytest.raises(DohnutsError, match="field '--json': is a symbolic link"):
        check_output_file(link, field="--json")
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "report.txt").symlink_to(victim)
    with pytest.raises(DohnutsError, match="holds the symbolic link 'report.txt'"):
        check_output_folder(folder, field="--out")
    check_output_folder(folder, field="--out", holds_new_folders=True)  # a command that only adds new folders
    linked = tmp_path / "linked-folder"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(DohnutsError, match="is a symbolic link"):
        check_output_folder(linked, field="--out")


@pytest.mark.parametrize("how", ["same path", "other spelling", "symlink", "hard link", "missing journal"])
def test_an_input_is_never_an_output_by_any_path(tmp_path, how):
    (tmp_path / "sub").mkdir()
    store = tmp_path / "store.sqlite"
    store.write_bytes(b"db")
    out = {"same path": store, "other spelling": tmp_path / "sub" / ".." / "store.sqlite",
           "symlink": tmp_path / "link", "hard link": tmp_path / "hard",
           "missing journal": tmp_path / "store.sqlite-wal"}[how]
    if how == "symlink":
        out.symlink_to(store)
    elif how == "hard link":
        os.link(store, out)
    inputs = [store, tmp_path / "store.sqlite-wal"]
    with pytest.raises(DohnutsError, match="is an input of this command"):
        check_output_file(out, inputs=inputs, field="--json")
    assert store.read_bytes() == b"db"


def test_nothing_is_written_into_a_run_folder(tmp_path):
    run = _run_folder(tmp_path)
    (tmp_path / "sub").mkdir()
    assert is_run_folder(run) and not is_run_folder(tmp_path)
    for path in (run / "report.txt", tmp_path / "sub" / ".." / "run" / "x.json"):
        with pytest.raises(DohnutsError, match="is in the run folder"):
            check_output_file(path, field="--out", make_folder=True)
    assert check_output_file(run / "report.html", run_folder_names=("report.html",)) == run / "report.html"
    with pytest.raises(DohnutsError, match="is in the run folder"):
        check_output_folder(run, field="--out")
    assert sorted(p.name for p in run.iterdir()) == ["results.jsonl"]  # nothing was created
    assert check_output_folder(run / "reports", field="--out").is_dir()  # a new folder below one is its own
    plain = tmp_path / "plain"  # records under another name: not a run folder, still the input's folder
    plain.mkdir()
    (plain / "records.jsonl").write_text("")
    with pytest.raises(DohnutsError, match="is the folder of this command's input"):
        check_output_folder(plain, inputs=[plain / "records.jsonl"], field="--out")


def test_a_good_output_passes_and_its_folder_is_made_only_on_request(tmp_path):
    assert check_output_file(tmp_path / "a.json", field="--json") == tmp_path / "a.json"
    with pytest.raises(DohnutsError, match="does not exist"):
        check_output_file(tmp_path / "new" / "a.json", field="--json")
    check_output_file(tmp_path / "later" / "a.json", field="--json", make_folder="later")
    assert not (tmp_path / "later").exists()
    check_output_file(tmp_path / "new" / "a.json", field="--json", make_folder=True)
    assert (tmp_path / "new").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(DohnutsError, match="is not a directory"):
        check_output_folder(tmp_path / "file" / "runs", field="--out", create=False)
    assert check_output_folder(tmp_path / "reports", field="--out").is_dir()
