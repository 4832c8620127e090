"""How fast `dohnuts train` updates on the CPU at each torch thread count, on a quiet or a loaded machine.

    python benchmarks/train_threads.py --threads default 1 2 --updates 8 --busy 0 2 --rounds 2

For each number of busy processes (`--busy`: that many pure-Python busy loops started beside the
measurement, the load other work puts on a shared machine, stopped when it ends) and each thread
setting (`default`: the command without --threads — one thread on a CPU, dohnuts.threads; before
that default, torch's own count, one a core), runs
`dohnuts train --model tiny --device cpu --updates N` in a fresh process, the settings taking
turns over --rounds rounds so that all meet the same load, and reads the time of each update from
the run's train_log.jsonl (the first update, which warms up, left out). Prints one line a setting:
the median and the slowest update, and the load average while it ran. The measurement behind the
default of `--threads` (dohnuts/cli.py, docs/measurement.md "A CPU run").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_LOOP = "while True: pass"


def update_seconds(log: Path) -> list[float]:
    """The wall time of each update after the first, from the log's update records."""
    times = [r["time"] for r in map(json.loads, log.read_text().splitlines()) if r.get("kind") == "update"]
    return [b - a for a, b in zip(times, times[1:])]


def one_run(threads: str, updates: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "dohnuts", "train", "--model", "tiny", "--device", "cpu", "--out", str(out),
           "--updates", str(updates), "--eval-every", str(updates), "--synthetic-train", "40"]
    if threads != "default":
        cmd += ["--threads", threads]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # nothing set from outside
    env["PYTHONPATH"] = str(ROOT)
    load0 = os.getloadavg()[0]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return {"seconds": update_seconds(out / "train_log.jsonl"), "load": (load0 + os.getloadavg()[0]) / 2}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", nargs="+", default=["default", "1", "2"], help="settings (default: default 1 2)")
    p.add_argument("--updates", type=int, default=8, help="updates a run (default: 8)")
    p.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy processes beside it (default: 0 2)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each setting, taking turns (default: 2)")
    args = p.parse_args(argv)
    for busy in args.busy:
        loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
        try:
            time.sleep(2 if busy else 0)  # the loops running before the first measurement
            got = {t: {"seconds": [], "load": []} for t in args.threads}
            with tempfile.TemporaryDirectory() as tmp:
                for r in range(args.rounds):
                    for t in args.threads:
                        res = one_run(t, args.updates, Path(tmp) / f"{busy}-{t}-{r}")
                        got[t]["seconds"] += res["seconds"]
                        got[t]["load"].append(res["load"])
        finally:
            for loop in loops:  # ours alone, by their handles
                loop.kill()
                loop.wait()
        for t, g in got.items():
            s = g["seconds"]
            print(f"busy {busy}  threads {t:>5}: median update {statistics.median(s):6.2f} s, slowest "
                  f"{max(s):6.2f} s over {len(s)} updates; load average {statistics.mean(g['load']):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
