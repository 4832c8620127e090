"""Does the interleaved gate catch a 15 % slowdown, and pass unchanged code, on this machine?

    PYTHONPATH=$PWD python benchmarks/maintainers/gate_detection.py --trials 10 [--rounds 10] [--calls 50] \\
        [--slowdown 0.15] [--out DATE-gate-detection.txt] [--note TEXT]

Two scratch copies of HEAD (`git clone --shared` into a temporary folder, HEAD checked out
detached, removed at the end: the repository is not touched; commit what is to be measured
first): "unchanged", and "slowed", in whose copy of bench_plugins/targets/dohnuts_target.py
`DohnutsTarget.run_call` is wrapped to busy-wait `--slowdown` × its own time after each call (the
CPU kept busy, as slower code would keep it). The product code is not touched: the wrapper exists
only in that scratch copy. Each trial is one
`dohnuts-bench gate --against HEAD benchmarks/maintainers/gate_detection.yaml` run from one copy; the trials
alternate unchanged, slowed, unchanged, ... so both meet the same hours of load. A trial records
the gate's exit status (0 passed, 1 regression), the ratio and interval it found, the smallest
slowdown it said it could detect, and the load other processes put on the machine each round
(its --json). The table and the counts go to stdout, and with --out to a text file headed by the
command and the machine.

The bar (issue "An honest instrument", item 4): at least 9 of 10 slowed trials fail the gate and
at least 9 of 10 unchanged trials pass it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).resolve().with_suffix(".yaml")
TARGET_FILE = Path("bench_plugins/targets/dohnuts_target.py")

INJECTION = '''

# --- benchmarks/maintainers/gate_detection.py, in its scratch copy only: every call {factor:g}x as long ---
def _slowed_for_the_gate_benchmark(run_call):
    import time

    def run_call_slowly(self, call, timer):
        t0 = time.perf_counter()
        result = run_call(self, call, timer)
        end = time.perf_counter() + {slowdown!r} * (time.perf_counter() - t0)
        while time.perf_counter() < end:  # busy: the CPU is kept, as slower code would keep it
            pass
        return result

    return run_call_slowly


DohnutsTarget.run_call = _slowed_for_the_gate_benchmark(DohnutsTarget.run_call)
'''


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def _machine() -> str:
    """This machine's id as the gate's baselines name it (dohnuts.bench.measure.machine_id), one torch thread."""
    import torch

    from dohnuts.bench.measure.machine_id import this_machine

    torch.set_num_threads(1)
    return this_machine(torch.device("cpu"))


def make_copies(scratch: Path, slowdown: float) -> dict[str, Path]:
    """The two scratch work trees of HEAD, the slowed one with the injection appended."""
    copies, head = {}, _git("rev-parse", "HEAD")
    for name in ("unchanged", "slowed"):
        copies[name] = scratch / name
        _git("clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(copies[name]))
        _git("checkout", "--quiet", "--detach", head, cwd=copies[name])
    with open(copies["slowed"] / TARGET_FILE, "a", encoding="utf-8") as f:
        f.write(INJECTION.format(slowdown=slowdown, factor=1 + slowdown))
    return copies


def trial(copy: Path, out_json: Path, rounds: int, calls: int) -> dict:
    """One gate run from `copy` (its tree on PYTHONPATH), against HEAD; its exit status and --json."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dohnuts.bench.cli", "gate", "--against", "HEAD", str(WORKLOAD),
                           "--rounds", str(rounds), "--calls", str(calls), "--json", str(out_json)],
                          cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"gate ended with status {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return {"exit": proc.returncode, "seconds": seconds, **json.loads(out_json.read_text())}


def row(i: int, name: str, t: dict) -> str:
    (g,) = t["groups"]
    loads = [x for x in t["load"] if x is not None]
    load = f"{statistics.median(loads):.2f} ({min(loads):.2f}–{max(loads):.2f})" if loads else "—"
    return (f"{i:>5}  {name:<9}  {t['exit']:>4}  {g['verdict']:<20}  {g['ratio']:.3f}  "
            f"{g['ci_low']:.3f}–{g['ci_high']:.3f}  {g['spread']:>6.1%}  {g['smallest_detectable']:>10.1%}  "
            f"{load:<17}  {t['seconds']:>5.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="trials of each copy (default: 10)")
    p.add_argument("--rounds", type=int, default=10, help="the gate's --rounds (default: 10)")
    p.add_argument("--calls", type=int, default=50, help="the gate's --calls (default: 50)")
    p.add_argument("--slowdown", type=float, default=0.15, help="injected slowdown, a fraction (default: 0.15)")
    p.add_argument("--out", help="also write the report to this text file")
    p.add_argument("--note", help="one line for the report's head (e.g. what else the machine ran)")
    args = p.parse_args(argv)
    command = "PYTHONPATH=$PWD python benchmarks/maintainers/gate_detection.py " + shlex.join(argv if argv is not None
                                                                               else sys.argv[1:])
    head = [f"# {command}",
            f"# {time.strftime('%Y-%m-%d %H:%M %Z')}; HEAD {_git('rev-parse', '--short=12', 'HEAD')}; "
            f"machine {_machine()} ({os.cpu_count()} CPUs); workload {WORKLOAD.relative_to(ROOT)}",
            f"# slowed: DohnutsTarget.run_call busy-waits {args.slowdown:g} x its own time (scratch copy only)",
            f"# load: cores other processes kept busy while the gate's calls ran, median (min–max) over its rounds",
            *([f"# note: {' '.join(args.note.split())}"] if args.note else []),
            "",
            "trial  copy       exit  verdict               ratio  interval     spread  detectable  load               "
            "    s"]
    print("\n".join(head), flush=True)
    lines = list(head)
    results: dict[str, list[dict]] = {"unchanged": [], "slowed": []}
    scratch = Path(tempfile.mkdtemp(prefix="gate-detection-"))
    try:
        copies = make_copies(scratch, args.slowdown)
        for i in range(1, args.trials + 1):
            for name in ("unchanged", "slowed"):
                t = trial(copies[name], scratch / f"{name}-{i}.json", args.rounds, args.calls)
                results[name].append(t)
                lines.append(row(i, name, t))
                print(lines[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    caught = sum(t["exit"] == 1 for t in results["slowed"])
    passed = sum(t["exit"] == 0 for t in results["unchanged"])
    mde = [t["smallest_detectable"] for ts in results.values() for t in ts]
    summary = [
        "",
        f"slowed {1 + args.slowdown:g}x: {caught} of {len(results['slowed'])} trials failed the gate (exit 1)",
        f"unchanged: {passed} of {len(results['unchanged'])} trials passed it (exit 0)",
        f"smallest detectable slowdown the trials reported: median {statistics.median(mde):.1%}, "
        f"range {min(mde):.1%}–{max(mde):.1%}",
        f"bar (>= 9 of 10 each): {'met' if caught >= 0.9 * args.trials and passed >= 0.9 * args.trials else 'NOT met'}",
    ]
    print("\n".join(summary))
    if args.out:
        Path(args.out).write_text("\n".join(lines + summary) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
