"""torch's CPU threads: `--threads` of `dohnuts predict`, `dohnuts train` and `dohnuts-bench run`.

On a CPU every command runs on one torch thread unless `--threads N` asks for more. On a machine
that other processes share, an operator split over more threads than there are free cores waits
at every one of its barriers for a thread the scheduler has parked. Measured on the shared 2-core
machine with two busy processes beside the run (`benchmarks/train_threads.py` and its output
`results/cpu/2026-12-04-train-threads.txt`, both at commit d37d1f2; the ledger's M34): a
tiny-preset training update took 0.9 s at the median and 1.9 s at the slowest on one thread, 4.7 s
and 23 s at torch's own default (one thread a core, two there). Without the busy processes two threads were a fifth faster at the median (0.23 s
against 0.29 s) and still stalled one update for 12.8 s. A GPU run keeps torch's default: there
the CPU threads only prepare batches. Imports no torch (the commands check their arguments before
torch loads).
"""

from __future__ import annotations

from dohnuts.errors import ConfigError

MAX_THREADS = 4096  # far above any CPU's cores: bounds what an argument can ask torch for
DEFAULT_CPU_THREADS = 1  # a CPU run's threads without --threads (module docstring)


def check_threads(value: int) -> None:
    """A `--threads` argument: torch's CPU threads, a number in [1, MAX_THREADS] (one line otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise ConfigError(f"must be a number of threads in [1, {MAX_THREADS}], got {value!r}", source="command line",
                          field="--threads")


def apply_threads(threads: int | None, device) -> None:
    """torch's intra-op threads for this process, once its device is known (`--device`; None: a
    GPU where there is one): `threads` (--threads) where given, else DEFAULT_CPU_THREADS on a CPU;
    a GPU device without --threads keeps torch's."""
    # torch: `--threads` is checked before torch, applied after
    import torch

    if threads is None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if torch.device(device).type != "cpu":
            return
        threads = DEFAULT_CPU_THREADS
    torch.set_num_threads(threads)
