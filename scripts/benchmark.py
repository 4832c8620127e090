"""The specification's benchmark command, a thin alias of `dohnuts-bench run --checkpoint`:

    python scripts/benchmark.py dohnuts --checkpoint runs/v1/checkpoint --output runs/v1/benchmarks/dohnuts.jsonl

measures the trained model at CHECKPOINT (a `dohnuts train --out` directory, one of its checkpoints
or an adapter file) on the standard suite's prediction workloads — complete calls, preprocessing
and transfers included — and writes the raw records to OUTPUT (the run directory, its report and
summary are written as every run's are). Any other argument goes to `dohnuts-bench run` (workload
files, --out, --hwspec, --quiet, ...). dohnuts.bench.measure.trained_model says what is measured.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "dohnuts":
        print("usage: python scripts/benchmark.py dohnuts --checkpoint PATH --output FILE.jsonl [dohnuts-bench run "
              "options]", file=sys.stderr)
        return 2
    from dohnuts.bench.cli import main as bench

    return bench(["run", *argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
