"""The transfer pipeline shared by prediction and training.

CPU worker threads prepare pinned batches (`submit`); one transfer stream copies batch i+1 to the
device while the compute stream runs batch i (`transfer`); a CUDA event orders each copy before
its use and `record_stream` keeps the copied buffers alive until the compute stream is done with
them (`wait`). On the CPU the same calls run without streams.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from dohnuts.runtime.batch import Batch, HostBatch
from dohnuts.runtime.timing import NULL_TIMER


class Pipeline:
    def __init__(self, device: torch.device, *, workers: int = 2):
        self.device = device
        self.cuda = device.type == "cuda"
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dohnuts-prepare")
        self._copy_stream = torch.cuda.Stream(device) if self.cuda else None

    def submit(self, fn, *args, **kwargs) -> Future:
        """Run CPU preparation on a worker thread."""
        return self._pool.submit(fn, *args, **kwargs)

    def transfer(self, hb: HostBatch, timer=NULL_TIMER) -> tuple[Batch, torch.cuda.Event | None]:
        """Issue the host→device copy on the transfer stream; returns (device batch, ready event).

        The `h2d` stage is timed on the transfer stream itself, so its device time is the copy's."""
        if not self.cuda:
            with timer.stage("h2d"):
                return hb.tensors, None
        with torch.cuda.stream(self._copy_stream):
            with timer.stage("h2d"):  # the timer records its events on the current (copy) stream
                dev = hb.tensors.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return dev, ready

    def wait(self, dev: Batch, ready: torch.cuda.Event | None) -> Batch:
        """Make the compute stream wait for a copy, and keep the copied buffers alive for it."""
        if ready is None:
            return dev
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(ready)
        packed = vars(dev).get("_packed")  # a packed batch's tensors are views of one buffer: recorded once
        if packed is not None:
            packed[0].record_stream(stream)
        for name, t in vars(dev).items():
            if isinstance(t, torch.Tensor) and (packed is None or name not in packed[1]):
                t.record_stream(stream)  # the copy stream allocated it; the compute stream uses it
        return dev

    def close(self) -> None:
        self._pool.shutdown(wait=True)
