"""Several processes, one model each: data-parallel training and sharded prediction.

One process per GPU (or several CPU processes), started by `torchrun` — or by `dohnuts train
--nproc-per-node N` / `dohnuts predict --nproc-per-node N`, which start it — and joined through
`torch.distributed` (NCCL between GPUs, gloo between CPU processes). Nothing here is home-made
process management: torchrun's agent starts the workers, and ends them all when one fails.

Training (dohnuts.train.step.Updater). An update keeps its meaning: the same 4 microbatches at one
parameter snapshot, their losses averaged, one clip, one step. Microbatch i of an update runs on
rank i mod W; every rank sums the gradients of its microbatches (each loss already divided by 4),
one all-reduce sums them across ranks, and every rank then clips and steps identically — the
parameters stay equal on every rank without being broadcast. With W = 2 or 4 the ranks share the
work evenly; with W = 3 one rank runs two microbatches (the update is still exactly 4); with W > 4
the extra ranks contribute zero gradients. The adapters and the head are small (LoRA), so their
gradients travel in one flat bucket after the backward passes instead of overlapping them.

Multi-node is the same code under torchrun's rendezvous, e.g. on each of two hosts:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        -m dohnuts.cli train --model qwen3.5-2b --data DIR --out RUN
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch


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


def launched() -> bool:
    """Whether this process was started by torchrun as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join(device: str | None) -> tuple[World, str | None]:
    """Join the process group torchrun set up (a single process: nothing to join). Returns the
    world and the device this rank uses (its own GPU, cuda:LOCAL_RANK, when it runs on CUDA)."""
    global _current
    if not launched():
        return SINGLE, device
    import torch.distributed as dist

    world = World(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
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
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current = SINGLE


def _flag_device() -> torch.device:
    """Where a small control tensor lives: NCCL reduces only CUDA tensors."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(value: int, world: World) -> int:
    """The largest of every rank's `value` (every rank gets it): ranks agree on a count."""
    if not world.distributed:
        return value
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_flag_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool, world: World) -> bool:
    """Whether any rank says True (every rank gets the answer): ranks agree to go on together."""
    return bool(max_over_ranks(int(bool(flag)), world))


def gradient_bytes(params: list[torch.nn.Parameter]) -> int:
    """Bytes one all-reduce of `all_reduce_gradients` carries (the flat bucket)."""
    return sum(p.numel() * p.element_size() for p in params)


def allreduce_busbw(world: World, nbytes: int = 64 << 20, repeat: int = 10) -> dict | None:
    """The all-reduce bus bandwidth of this world (nccl-tests' busbw: algbw · 2(n−1)/n, bytes a
    rank sends per second), measured on a FP32 buffer of `nbytes` after 3 warm-up calls: the
    interconnect's measured ceiling. Every rank must call it; rank 0 gets the entry, others None."""
    if not world.distributed:
        return None
    import datetime
    import time

    import torch.distributed as dist

    dev = _flag_device()
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    for _ in range(3):
        dist.all_reduce(x)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    n = world.size
    busbw = nbytes / t * 2 * (n - 1) / n
    if not world.is_main:
        return None
    return {"value": busbw, "kind": "bandwidth", "processes": n, "backend": dist.get_backend(),
            "method": f"all_reduce of {nbytes >> 20} MiB FP32 over {n} processes ({dist.get_backend()}), median of "
                      f"{repeat}, bus bandwidth = bytes · 2(n−1)/n / time",
            "date": datetime.date.today().isoformat()}


def all_reduce_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Sum every parameter's gradient over the ranks, in one flat bucket (missing grads count as 0)."""
    if not world.distributed:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def all_reduce_sum(x: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def barrier(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()
