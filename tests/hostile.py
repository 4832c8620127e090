"""What a hostile user hands the project, for the tests: special files (a FIFO, a socket, a device),
over-long names, a disk that fills during a write, and a guard that turns a hang into a failure."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG_NAME = "x" * 300 + ".png"  # over NAME_MAX (255 bytes) on every common file system


@contextmanager
def no_hang(seconds: int = 300):
    """Fail (TimeoutError) instead of blocking forever, e.g. on a FIFO opened for reading."""
    def alarm(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def fifo(path: Path) -> Path:
    """A named pipe nobody writes to: opening it for reading blocks forever."""
    os.mkfifo(path)
    return path


@contextmanager
def unix_socket(path: Path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    try:
        yield path
    finally:
        s.close()


def _limit_file_size(limit: int):
    def apply():
        # Writes past `limit` bytes of any file fail (EFBIG) after a short write, as on a full disk;
        # SIGXFSZ ignored so the write returns the error instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run_with_full_disk(args: list[str], limit: int, *, cwd: Path = ROOT, timeout: int = 300,
                       env: dict | None = None) -> subprocess.CompletedProcess:
    """`python ARGS` in a process whose files cannot grow past `limit` bytes: every write that
    would cross it is cut short and then fails, as when the disk fills during it."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limit_file_size(limit), check=False)


# Adapter metadata the issue names — malformed `lora` JSON, `alpha` missing or NaN, wrong types for
# `targets`, `temperature`, `extra` and `base_identity`, a temperature NaN, 0, infinite or negative —
# as (metadata changes, the field named, why), for every command that takes an adapter.
HOSTILE_ADAPTER_META = [
    ({"lora": "{not json"}, "lora", "is not valid JSON"),
    ({"lora": '{"rank": 2, "dropout": 0.0, "targets": ["q_proj"]}'}, "lora.alpha", "is missing"),
    ({"lora": '{"rank": 2, "alpha": NaN, "dropout": 0.0, "targets": ["q_proj"]}'}, "lora.alpha", "finite"),
    ({"lora": '{"rank": 2, "alpha": 16, "dropout": 0.0, "targets": "q_proj"}'}, "lora.targets", "must be a list"),
    ({"temperature": "warm"}, "temperature", "must be a number, got 'warm'"),
    ({"temperature": "nan"}, "temperature", "must be a finite number, got NaN"),
    ({"temperature": "0"}, "temperature", "must be positive, got 0.0"),
    ({"temperature": "inf"}, "temperature", "must be a finite number, got infinite"),
    ({"temperature": "-1"}, "temperature", "must be positive"),  # probabilities inverted against `choice`
    ({"extra": "[]"}, "extra", "must be a mapping"),
    ({"base_identity": "5"}, "base_identity", "must be a mapping"),
]
HOSTILE_ADAPTER_IDS = [f"{field}-{i}" for i, (_, field, _) in enumerate(HOSTILE_ADAPTER_META)]


def hostile_adapter(path: Path, meta: dict) -> Path:
    """An adapter file, valid but for the metadata changes `meta` (its metadata is read first)."""
    import torch
    from safetensors.torch import save_file

    base = {"format": "dohnuts-adapter-1", "lora": '{"rank": 2, "alpha": 16, "dropout": 0.0, "targets": ["q_proj"]}',
            "base_identity": "{}", "temperature": "1.0", "extra": "{}"}
    save_file({"head.weight": torch.zeros(1, 64)}, str(path), metadata={**base, **meta})
    return path


# The smallest text workload a run measures (tiny preset, 2 calls): the bad-input tests' run.
SMALL_TEXT_WORKLOAD = """\
kind: text
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 2
halfwidth: 0
shape: {requests: 1, questions: 1, seq_tokens: 64, candidates: 2, candidate_tokens: 2}
"""


def one_error_line(capsys, *needles: str) -> str:
    """The one line a refused command wrote to stderr (no traceback), holding every needle."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]
