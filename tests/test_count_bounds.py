"""Every count a user gives is bounded (dohnuts.limits, issue 47): processes per node, baseline runs,
questions and candidates in a request line, a training seed. Each is refused in one line naming it,
before anything starts — a request line's bound costs that line only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dohnuts.cli import main
from dohnuts.limits import MAX_CANDIDATES_PER_QUESTION, MAX_PROCESSES_PER_NODE, MAX_QUESTIONS_PER_REQUEST, MAX_SEED

GOOD = {"id": "g1", "questions": [{"id": "q1", "text": "Which is red?", "candidates": ["red", "green"]}]}


def _one_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _refuse(what: str):
    def refuse(*args, **kw):
        raise AssertionError(f"{what} was started")

    return refuse


@pytest.fixture
def no_torchrun(monkeypatch):
    """A launch of torchrun fails the test: a refused count starts nothing."""
    import dohnuts.launch

    monkeypatch.setattr(dohnuts.launch, "launch", _refuse("torchrun"))


@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails the test: a refused argument builds nothing."""
    import dohnuts.api

    monkeypatch.setattr(dohnuts.api, "load", _refuse("a model"))


@pytest.mark.parametrize("command", ["predict", "train"])
@pytest.mark.parametrize("n", ["100000", str(MAX_PROCESSES_PER_NODE + 1), "0", "-3"])
def test_processes_per_node_are_bounded(tmp_path, capsys, no_torchrun, command, n):
    """`dohnuts predict --nproc-per-node 100000` once started torchrun with 100,000 workers."""
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(GOOD) + "\n")
    args = ([src.as_posix(), "-o", str(tmp_path / "out.jsonl")] if command == "predict"
            else ["--out", str(tmp_path / "run"), "--updates", "1"])
    assert main([command, *args, "--nproc-per-node", n]) == 2
    _one_line(capsys, "--nproc-per-node", f"must be in 1..{MAX_PROCESSES_PER_NODE}", f"got {n}")
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "run").exists()


def test_processes_per_node_help_states_the_bound(capsys):
    for command in ("predict", "train"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"1 to {MAX_PROCESSES_PER_NODE}" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("seed", [str(10**20), str(MAX_SEED + 1), "-1"])
def test_a_training_seed_must_fit_the_generators(tmp_path, capsys, no_model, seed):
    """`dohnuts train --seed 100000000000000000000` once ended in a traceback (an overflow in torch)."""
    assert main(["train", "--out", str(tmp_path / "run"), "--updates", "1", "--seed", seed]) == 2
    _one_line(capsys, "--seed")
    assert not (tmp_path / "run").exists()


def test_the_largest_seed_is_taken_by_every_generator():
    """MAX_SEED and the offsets the runtime adds to it (seed + 7 for the vision tower) fit torch's,
    numpy's and Python's generators, and the config accepts it."""
    import random

    import numpy as np
    import torch

    from dohnuts.train.config import train_config

    assert train_config({"seed": MAX_SEED}).seed == MAX_SEED
    torch.Generator().manual_seed(MAX_SEED + 7)           # dohnuts.api: the vision tower's seed
    random.Random(MAX_SEED * 1_000_003 + 10**6)           # dohnuts.train.trainer.microbatch_order
    np.random.default_rng(MAX_SEED)


@pytest.mark.parametrize("runs", ["100000000", "101", "1"])
def test_baseline_runs_are_bounded(tmp_path, capsys, monkeypatch, runs):
    """`dohnuts-bench baseline --runs 100000000` was accepted."""
    from dohnuts.bench.cli import main as bench_main
    from dohnuts.bench.commands import run as run_command

    monkeypatch.setattr(run_command, "run", _refuse("a baseline run"))
    assert bench_main(["baseline", "--runs", runs, "--into", str(tmp_path / "b"), "--every", "0"]) == 2
    _one_line(capsys, "--runs", "must be in 2..100")
    assert not (tmp_path / "b").exists()


def test_a_request_over_the_bounds_costs_its_own_line(tmp_path, capsys):
    """One predict line of 60,000 questions (2.9 MB) once asked one pass for more memory than the
    machine had: a traceback, and the good lines before and after it lost. Now that line is an error
    record, and every other line is scored."""
    big = {"id": "big", "questions": [{"id": f"q{i}", "text": "Which?", "candidates": ["a", "b"]}
                                      for i in range(60_000)]}
    wide = {"id": "wide", "questions": [{"id": "q", "text": "Which?",
                                         "candidates": [str(i) for i in range(MAX_CANDIDATES_PER_QUESTION + 1)]}]}
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in (GOOD, big, wide, {**GOOD, "id": "g2"})))
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out), "--threads", "1"]) == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["g1", f"{src}:2", f"{src}:3", "g2"]  # (an unread line: its place)
    assert "questions" in records[0] and "questions" in records[3]
    assert records[1]["line"] == 2 and f"at most {MAX_QUESTIONS_PER_REQUEST} entries" in records[1]["error"]
    assert records[2]["line"] == 3 and f"at most {MAX_CANDIDATES_PER_QUESTION} entries" in records[2]["error"]
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{src}:2:" in err and f"{src}:3:" in err


def test_a_request_at_the_bounds_is_read():
    from dohnuts.runtime.requests import parse_line

    line = {"questions": [{"text": "Which?", "candidates": [str(i) for i in range(MAX_CANDIDATES_PER_QUESTION)]}]
            * MAX_QUESTIONS_PER_REQUEST}
    req = parse_line(json.dumps(line), source="r.jsonl:1")
    assert len(req.questions) == MAX_QUESTIONS_PER_REQUEST
    assert len(req.questions[0].candidates) == MAX_CANDIDATES_PER_QUESTION


def test_the_bounds_are_said_where_users_look():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for bound in (f"--nproc-per-node` ≤ {MAX_PROCESSES_PER_NODE}", f"{MAX_QUESTIONS_PER_REQUEST:,} questions",
                  "--runs` ≤ 100", "--seed` in 0..2³²−1"):
        assert bound in readme, bound
