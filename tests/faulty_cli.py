"""The `dohnuts` command with a fault injected (tests only; started as a process):

    python -m tests.faulty_cli RANK UPDATE train ... [--nproc-per-node N]

rank RANK exits abruptly (status 17, nothing flushed or cleaned) once it has computed update
UPDATE — through the trainer's `after_update` callback; `--nproc-per-node` starts its workers
through this same entry, so the fault reaches them too."""

from __future__ import annotations

import os
import sys

from dohnuts.cli import main


def run(argv: list[str]) -> int:
    rank, update, *rest = argv

    def fault(world, u: int) -> None:
        if world.rank == int(rank) and u == int(update):
            os._exit(17)

    return main(rest, after_update=fault, entry=("-m", "tests.faulty_cli", rank, update))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
