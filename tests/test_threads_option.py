"""`--threads` of `dohnuts predict` and `dohnuts train` (torch's CPU threads, KI-21's fix): bounds
checked before anything runs (one line naming the option, exit status 2, nothing written), the
value applied to the process, and a machine setting that a resumed run may change."""

from __future__ import annotations

import json

import pytest
import torch

from dohnuts.api import MAX_THREADS
from dohnuts.cli import main


@pytest.fixture
def restore_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("command", ["predict", "train"])
@pytest.mark.parametrize("value", ["0", "-1", str(MAX_THREADS + 1)])
def test_out_of_bounds_is_one_line_and_writes_nothing(command, value, tmp_path, capsys, restore_threads):
    before = torch.get_num_threads()
    where = ["requests.jsonl", "-o", str(tmp_path / "out.jsonl")] if command == "predict" else \
        ["--out", str(tmp_path / "run"), "--updates", "1"]
    assert main([command, "--threads", value, *where]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dohnuts: error: command line: field '--threads': must be a number of threads in "
                   f"[1, {MAX_THREADS}], got {int(value)}"]
    assert list(tmp_path.iterdir()) == [] and torch.get_num_threads() == before


def test_predict_runs_on_the_threads_asked_for(tmp_path, restore_threads):
    req = {"id": "r1", "prefix": "a shared context", "questions": [
        {"id": "q1", "text": "Which?", "candidates": ["red", "green"]}]}
    src = tmp_path / "requests.jsonl"
    src.write_text(json.dumps(req) + "\n")
    want = 1 if torch.get_num_threads() != 1 else 2
    assert main(["predict", "--model", "tiny", "--device", "cpu", "--threads", str(want), str(src),
                 "-o", str(tmp_path / "out.jsonl")]) == 0
    assert torch.get_num_threads() == want
    (line,) = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(json.loads(line)["questions"][0]["scores"]) == 2


def test_a_resumed_run_may_change_its_threads(tmp_path, restore_threads):
    run = tmp_path / "run"
    base = ["train", "--model", "tiny", "--device", "cpu", "--out", str(run), "--synthetic-train", "8",
            "--eval-every", "1", "--lora-rank", "2"]
    assert main([*base, "--updates", "1", "--threads", "1"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--updates", "2", "--threads", "2"]) == 0
    assert torch.get_num_threads() == 2
    log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert max(r.get("update", 0) for r in log) == 2
