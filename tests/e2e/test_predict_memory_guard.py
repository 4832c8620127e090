"""The per-line memory guard of `dohnuts predict` (dohnuts.runtime.memory_guard, issue 47): a request
whose one pass needs more memory than the machine has free costs its own line — an error record —
and the good lines before and after it are scored and written. Once it ended the run in a traceback
with an empty output."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dohnuts.cli import main
from dohnuts.config import preset
from dohnuts.runtime import memory_guard
from dohnuts.runtime.work import WorkCounts

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"id": "g1", "questions": [{"id": "q", "text": "Which is red?", "candidates": ["red", "green"]}]}
# Within the request bounds (dohnuts.limits), but one pass of 4,096 rows forked from a 560-byte prefix:
# about 4 GiB on the CPU's reference path.
BIG = {"id": "big", "questions": [{"id": f"q{i}", "text": "Which? " + "x" * 560, "candidates": ["a", "b"]}
                                  for i in range(4096)]}


def _requests(tmp_path: Path) -> Path:
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in (GOOD, BIG, {**GOOD, "id": "g2"})))
    return src


def _check_output(out: Path, src: Path, why: str) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["g1", "big", "g2"]
    assert "questions" in records[0] and "questions" in records[2]  # the lines around it are scored
    assert records[1]["line"] == 2 and why in records[1]["error"] and "split it" in records[1]["error"]


def test_a_request_larger_than_the_free_memory_costs_its_own_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory_guard, "free_bytes", lambda device: 1 << 30)  # a machine with 1 GiB free
    src, out = _requests(tmp_path), tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out), "--threads", "1"]) == 2
    _check_output(out, src, "more than the 1.0 GiB free on cpu")
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{src}:2: needs about" in err


def test_an_allocation_that_fails_in_the_pass_costs_its_own_line(tmp_path, capsys, monkeypatch):
    """The estimate let the request through (it is an estimate), and the CPU allocator refused."""
    from dohnuts.runtime.predict import Predictor

    real = Predictor.compute

    def compute(self, hb, dev, ready, timer):
        if hb.plan.request.id == "big":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 1228800000 bytes. Error code 12")
        return real(self, hb, dev, ready, timer)

    monkeypatch.setattr(memory_guard, "free_bytes", lambda device: 1 << 50)
    monkeypatch.setattr(Predictor, "compute", compute)
    src, out = _requests(tmp_path), tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out), "--threads", "1"]) == 2
    _check_output(out, src, "ran out of memory in its one pass (4096 questions")
    assert "Traceback" not in capsys.readouterr().err


def test_other_errors_in_a_pass_are_not_taken_for_memory(tmp_path, monkeypatch):
    from dohnuts.runtime.predict import Predictor

    def compute(self, hb, dev, ready, timer):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(Predictor, "compute", compute)
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(GOOD) + "\n")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(["predict", str(src), "-o", str(tmp_path / "out.jsonl"), "--threads", "1"])


def test_the_estimate_by_hand():
    """tiny: widest width 128 (MLP 128, conv channels 2·2·16 + 4·16, attention 4·32); the reference
    path's states 4 · 4·16·16; one attention and three delta-rule layers."""
    cfg = preset("tiny")
    work = WorkCounts(sequences=10, seq_lens=(30,) * 10, padded_len=20, prefix_len=10)
    tokens = 10 + 10 * 20
    per_token = 16 * 128 + 4 * 4 * 16 * 16
    forked = 10 * (10 * 1 * 2 * 2 * 32 + 3 * (4 * 16 * 16 + 128 * 4))
    scores = 10 * 4 * 20 * (10 + 20)
    assert memory_guard.activation_bytes(cfg, work, element_bytes=4, reference=True) == 4 * (
        tokens * per_token + forked + scores)
    assert memory_guard.activation_bytes(cfg, work, element_bytes=4, reference=False) == 4 * (
        tokens * 16 * 128 + forked + scores)


def test_a_small_request_asks_the_system_nothing(monkeypatch):
    """Below CHECK_FROM_BYTES no free memory is looked up (the guard costs arithmetic on the hot path)."""
    import dohnuts

    session = dohnuts.load("tiny")
    monkeypatch.setattr(memory_guard, "free_bytes", lambda device: pytest.fail("asked for free memory"))
    memory_guard.check_request_memory(session, WorkCounts(sequences=8, seq_lens=(64,) * 8, padded_len=64))


def test_under_an_address_space_limit_the_good_lines_are_written(tmp_path):
    """The issue's case as a user met it: `predict` under a memory limit (RLIMIT_AS, `ulimit -v`) with one
    request too large — the limit is the room the guard measures."""
    probe = subprocess.run([sys.executable, "-c", "import psutil, dohnuts; dohnuts.load('tiny'); "
                            "print(psutil.Process().memory_info().vms)"], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=300)
    limit = int(probe.stdout.split()[-1]) + (2 << 30)  # the loaded model and 2 GiB: the big pass needs about 4

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    src, out = _requests(tmp_path), tmp_path / "out.jsonl"
    p = subprocess.run([sys.executable, "-m", "dohnuts", "predict", str(src), "-o", str(out), "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       preexec_fn=limited, timeout=600, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    _check_output(out, src, "split it")
