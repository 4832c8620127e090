"""The process group: which of several processes this one is, joined and left.

One process per GPU (or several CPU processes), started by `torchrun` — or by `dohnuts train
--nproc-per-node N` / `dohnuts predict --nproc-per-node N`, which start it (dohnuts.launch) — and
joined through `torch.distributed` (NCCL between GPUs, gloo between CPU processes). Nothing here is
home-made process management: torchrun's agent starts the workers, and ends them all when one fails.

This is the only module that reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK; everything else is
handed the `World` it returns. What the ranks exchange is in dohnuts.runtime.collectives.

Multi-node is the same code under torchrun's rendezvous, e.g. on each of two hosts:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        -m dohnuts.cli train --model qwen3.5-2b --data DIR --out RUN
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dohnuts.errors import DohnutsError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def microbatches(self, n: int) -> list[int]:
        """The indices (of an update's n microbatches) this rank runs: i with i mod size == rank."""
        return [i for i in range(n) if i % self.size == self.rank]


SINGLE = World()
_current = SINGLE


def current_world() -> World:
    """The world this process joined (SINGLE until `join` made it one of several)."""
    return _current


def _env_int(name: str, raw: str | None, *, low: int, default: int | None = None) -> int:
    """torchrun's variable `name` (its value `raw`, read by the caller where the variable is named)
    as an integer ≥ low; a missing or garbled one is one DohnutsError line."""
    if raw is None or not raw.strip():
        if default is not None:
            return default
        raise DohnutsError(f"is not set, but WORLD_SIZE={os.environ.get('WORLD_SIZE')} says this is one of several "
                           "processes: torchrun sets RANK, WORLD_SIZE and LOCAL_RANK together (start the command "
                           "with --nproc-per-node N, or unset WORLD_SIZE)", source=f"environment variable {name}")
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise DohnutsError(f"must be an integer ≥ {low}, got {raw[:40]!r} (torchrun sets it; unset it to run one "
                           "process)", source=f"environment variable {name}")
    return value


def launched() -> bool:
    """Whether this process was started by torchrun as one of several (WORLD_SIZE above 1; a
    WORLD_SIZE that is not a positive integer is one DohnutsError line)."""
    return _env_int("WORLD_SIZE", os.environ.get("WORLD_SIZE"), low=1, default=1) > 1


def launch_world() -> World:
    """The world torchrun's variables describe (SINGLE when not launched), checked: RANK in
    0..WORLD_SIZE−1, LOCAL_RANK ≥ 0; a missing or garbled one is one DohnutsError line."""
    if not launched():
        return SINGLE
    size = _env_int("WORLD_SIZE", os.environ.get("WORLD_SIZE"), low=1)
    rank = _env_int("RANK", os.environ.get("RANK"), low=0)
    if rank >= size:
        raise DohnutsError(f"is {rank}, but WORLD_SIZE is {size} (ranks run 0..{size - 1})",
                           source="environment variable RANK")
    return World(rank, size, _env_int("LOCAL_RANK", os.environ.get("LOCAL_RANK"), low=0, default=0))


def join(device: str | None) -> tuple[World, str | None]:
    """Join the process group torchrun set up (a single process: nothing to join). Returns the
    world and the device this rank uses (its own GPU, cuda:LOCAL_RANK, when it runs on CUDA)."""
    global _current
    if not launched():
        return SINGLE, device

    world = launch_world()
    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.set_device(world.local_rank)
        device = f"cuda:{world.local_rank}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=30))
    _current = world
    return world, device or "cpu"


def leave() -> None:
    global _current

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current = SINGLE
