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
import re
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


# -- the launcher of `--nproc-per-node N` ---------------------------------------------------------

_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FIRST_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")


def torchrun_failure(lines) -> tuple[int | None, int | None]:
    """(failed rank, its exit code) from torchrun's log lines, or (None, None): the first failure
    it logged ("failed (exitcode: 17) local_rank: 1"), corrected by the "Root Cause" block of its
    report (the other ranks it stopped come under "Failures")."""
    failed_rank = exitcode = None
    root = False
    for line in lines:
        m = _FIRST_FAILURE.search(line)
        if m and failed_rank is None:
            exitcode, failed_rank = int(m.group(1)), int(m.group(2))
        if "Root Cause" in line:
            root = True
        elif root and (m := _ROOT_RANK.match(line)):
            failed_rank = int(m.group(1))
        elif root and (m := _ROOT_EXIT.match(line)):
            exitcode = int(m.group(1))
    return failed_rank, exitcode


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    failed_rank: int | None = None
    exitcode: int | None = None


def launch(argv: list[str], nproc: int) -> LaunchResult:
    """Run `python -m dohnuts.cli ARGV` as `nproc` processes under torchrun (standalone rendezvous on
    this host). The workers' own lines pass through; torchrun's error report is read, not shown:
    when a worker fails torchrun ends the others, and the caller reports the failed rank in one line."""
    import subprocess
    import sys

    import tempfile

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "dohnuts.cli", *argv]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    status = tempfile.NamedTemporaryFile(prefix="dohnuts-status-", delete=False)
    status.close()
    env[STATUS_FILE] = status.name
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)  # torchrun's report, read for the failed rank once it ends
        text = _RANK_PREFIX.sub("", line)
        if text.startswith("dohnuts:"):  # the workers' own messages; tracebacks and torchrun's log are read only
            sys.stderr.write(text)
    code = proc.wait()
    failed_rank, exitcode = torchrun_failure(lines)
    try:
        with open(status.name) as f:
            reported = f.read().strip()
    finally:
        os.unlink(status.name)
    if code == 0 and reported:  # the run's own outcome, e.g. 2: some request lines were refused
        code = int(reported)
    return LaunchResult(code, failed_rank, exitcode)


STATUS_FILE = "DOHNUTS_STATUS_FILE"


def report_status(world: World, code: int) -> int:
    """A rank's exit status for the launcher: torchrun reads any non-zero status as a failed worker,
    so rank 0 hands a run's own outcome (2: some lines refused) to the launcher in a file and the
    workers exit 0. Without a launcher (plain torchrun) the code is returned as it is."""
    path = os.environ.get(STATUS_FILE)
    if not path:
        return code
    if world.is_main:
        with open(path, "w") as f:
            f.write(str(code))
    return 0


def fault_point(world: World, update: int) -> None:
    """Fault injection for tests: DOHNUTS_FAULT_EXIT="rank=R,update=U" makes rank R exit abruptly
    (status 17, nothing flushed or cleaned) once it has computed update U."""
    spec = os.environ.get("DOHNUTS_FAULT_EXIT")
    if not spec:
        return
    fields = dict(part.split("=", 1) for part in spec.split(","))
    if int(fields.get("rank", -1)) == world.rank and int(fields.get("update", -1)) == update:
        os._exit(17)
