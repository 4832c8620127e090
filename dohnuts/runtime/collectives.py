"""What the ranks of a process group (dohnuts.runtime.process_group) exchange: gradients, sums,
agreed counts, barriers. With one process every function is a no-op.

Training (dohnuts.train.step.Updater). An update keeps its meaning: the same 4 microbatches at one
parameter snapshot, their losses averaged, one clip, one step. Microbatch i of an update runs on
rank i mod W; every rank sums the gradients of its microbatches (each loss already divided by 4),
one all-reduce sums them across ranks, and every rank then clips and steps identically — the
parameters stay equal on every rank without being broadcast. With W = 2 or 4 the ranks share the
work evenly; with W = 3 one rank runs two microbatches (the update is still exactly 4); with W > 4
the extra ranks contribute zero gradients. The adapters and the head are small (LoRA), so their
gradients travel in one flat bucket after the backward passes instead of overlapping them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dohnuts.runtime.process_group import World


def collective_device() -> torch.device:
    """Where a tensor the ranks reduce lives: NCCL reduces only CUDA tensors (this rank's GPU)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(value: int, world: World) -> int:
    """The largest of every rank's `value` (every rank gets it): ranks agree on a count."""
    if not world.distributed:
        return value

    t = torch.tensor([int(value)], dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool, world: World) -> bool:
    """Whether any rank says True (every rank gets the answer): ranks agree to go on together."""
    return bool(max_over_ranks(int(bool(flag)), world))


def gradient_bytes(params: list[torch.nn.Parameter]) -> int:
    """Bytes one all-reduce of `all_reduce_gradients` carries (the flat bucket)."""
    return sum(p.numel() * p.element_size() for p in params)


def all_reduce_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Sum every parameter's gradient over the ranks, in one flat bucket (missing grads count as 0)."""
    if not world.distributed:
        return

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

        dist.all_reduce(x)
    return x


def barrier(world: World) -> None:
    if world.distributed:

        dist.barrier()
