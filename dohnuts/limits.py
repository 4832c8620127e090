"""Bounds on the counts a user gives the `dohnuts` commands: each one a typo cannot turn into a
machine brought down (100,000 torchrun workers, a request of 60,000 questions batched in one pass)
or a number a generator cannot take (a seed over 64 bits).

A count outside its bound is one line naming the argument or the request field (exit status 2; a
request line's bound costs that line only). The benchmark's workload files have bounds of their own,
declared beside their fields (dohnuts.bench.measure.workload, the kinds' `Shape`s).
"""

from __future__ import annotations

from dohnuts.errors import DohnutsError

# --nproc-per-node: more than any one machine's GPUs (8 to 16); on a CPU each process loads its own model.
MAX_PROCESSES_PER_NODE = 64
# --seed: what torch's, numpy's and Python's generators all take as it is (offsets such as seed + 7 included).
MAX_SEED = 2**32 - 1
# A request line: questions (each one sequence of the request's one batched pass) and candidates per question,
# the sizes a benchmark workload may ask for (dohnuts_bench_plugins.workloads).
MAX_QUESTIONS_PER_REQUEST = 4096
MAX_CANDIDATES_PER_QUESTION = 1024


def check_processes(n: int) -> None:
    """`--nproc-per-node N` in 1..MAX_PROCESSES_PER_NODE, or one line naming the argument."""
    if not 1 <= n <= MAX_PROCESSES_PER_NODE:
        raise DohnutsError(f"must be in 1..{MAX_PROCESSES_PER_NODE} (processes on this node), got {n}",
                           source="--nproc-per-node")
