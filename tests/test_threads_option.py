"""`--threads` of `dohnuts predict` and `dohnuts train` (torch's CPU threads, KI-21's fix): bounds
checked before anything runs (one line naming the option, exit status 2, nothing written), the
value applied to the process, a machine setting that a resumed run may change, and the default
on a CPU: one thread (dohnuts.threads says what was measured)."""

from __future__ import annotations

import json

import pytest
import torch

from dohnuts.threads import DEFAULT_CPU_THREADS, MAX_THREADS, apply_threads
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


def test_a_cpu_run_without_threads_runs_on_one(tmp_path, restore_threads):
    """The default (dohnuts.threads): one thread on a CPU, whatever torch's own count was."""
    torch.set_num_threads(2)
    req = {"id": "r1", "questions": [{"id": "q1", "text": "Which?", "candidates": ["red", "green"]}]}
    src = tmp_path / "requests.jsonl"
    src.write_text(json.dumps(req) + "\n")
    assert main(["predict", "--model", "tiny", "--device", "cpu", str(src), "-o", str(tmp_path / "out.jsonl")]) == 0
    assert torch.get_num_threads() == DEFAULT_CPU_THREADS == 1
    torch.set_num_threads(2)
    assert main(["train", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "run"), "--synthetic-train",
                 "8", "--eval-every", "1", "--lora-rank", "2", "--updates", "1"]) == 0
    assert torch.get_num_threads() == 1


def test_the_default_leaves_a_gpu_run_torch_s_threads(restore_threads):
    torch.set_num_threads(2)
    apply_threads(None, "cuda:0")  # a device name: no GPU is needed to decide
    assert torch.get_num_threads() == 2
    apply_threads(3, "cuda")  # --threads is applied on any device
    assert torch.get_num_threads() == 3
    apply_threads(None, "cpu")
    assert torch.get_num_threads() == 1
