"""Time to first result of a new process: `dohnuts predict` from process start to its first output line.

    python benchmarks/maintainers/cold_start.py --model qwen3.5-2b --questions 32 --seq 512 --runs 2 --out cold.json

Writes a request file (text questions of about --seq byte tokens each), then starts `dohnuts
predict` --runs times, one after another, each a fresh Python process, and records the wall time
until the first result line is written and until the process exits. On a GPU the first result
includes loading the model, compiling or loading Triton kernels (and fla's autotuning choices)
from TRITON_CACHE_DIR, and capturing the CUDA graphs of the request's shape; the first run on a
machine fills the cache, the later ones show what a user who has run once waits.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_requests(path: Path, *, requests: int, questions: int, seq: int, seed: int = 0) -> None:
    rng = random.Random(seed)

    def words(n: int) -> str:
        text = ""
        while len(text) < n:
            text += "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))) + " "
        return text[:n]

    with path.open("w") as f:
        for r in range(requests):
            qs = [{"id": f"q{i}", "text": words(seq - 60), "candidates": [words(8) for _ in range(4)]}
                  for i in range(questions)]
            f.write(json.dumps({"id": f"r{r}", "questions": qs}) + "\n")


def time_process(cmd: list[str], out: Path, timeout: float) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and out.exists() and out.stat().st_size > 0:
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            break
        time.sleep(0.05)
    total = time.perf_counter() - t0
    if first is None and out.exists() and out.stat().st_size > 0:
        first = total
    err = proc.stderr.read() if proc.stderr else ""
    return {"first_result_s": first, "exit_s": total, "returncode": proc.returncode, "stderr_tail": err[-800:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3.5-2b")
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--questions", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default="cold_start.json")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requests.jsonl"
        write_requests(req, requests=a.requests, questions=a.questions, seq=a.seq)
        runs = []
        for i in range(a.runs):
            out = Path(tmp) / f"out{i}.jsonl"
            cmd = [sys.executable, "-m", "dohnuts.cli", "predict", "--model", a.model, str(req), "-o", str(out)]
            runs.append(time_process(cmd, out, a.timeout))
            print(f"run {i}: first result {runs[-1]['first_result_s']} s, exit {runs[-1]['exit_s']:.1f} s, "
                  f"status {runs[-1]['returncode']}", flush=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "questions": a.questions, "seq": a.seq, "runs": runs},
                                      indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
