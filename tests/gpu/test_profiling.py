"""Issue 49's profiler conventions on a CUDA device: a measured call whose stages are NVTX ranges
(`run --nvtx`), inside the `torch.cuda.profiler.start()`/`stop()` bracket of the measured calls,
keeps its device times and its record; the NVTX ranges are NVIDIA's package's where it is
installed (a recording stand-in otherwise, which still checks that they are balanced)."""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest
import torch

from dohnuts.bench.calls import CallResult
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure.call import measure_call, untimed_call_ms
from dohnuts.bench.measure.record import TargetContext
from dohnuts.bench.measure.telemetry import TelemetryThread
from dohnuts.bench.measure.trace import measured_window
from dohnuts.runtime.timing import NvtxRanges
from dohnuts.runtime.work import WorkCounts
from tests.gpu.helpers import DEV

pytestmark = pytest.mark.gpu
CUDA = torch.device(DEV)


class MatmulTarget:
    """Two stages of real device work: a copy in, a few matmuls."""

    def __init__(self):
        self.host = torch.randn(1024, 1024).pin_memory()
        self.weight = torch.randn(1024, 1024, device=DEV)

    def run_call(self, call, timer):
        with timer.stage("h2d"):
            x = self.host.to(DEV, non_blocking=True)
        with timer.stage("forward"):
            for _ in range(4):
                x = torch.tanh(x @ self.weight)
        return CallResult(decisions=1, work=WorkCounts(sequences=1, seq_lens=(8,), padded_len=8, candidates=2))


def _nvtx_module(log: list):
    try:
        import nvtx

        return nvtx
    except ImportError:
        module = types.ModuleType("nvtx")
        module.push_range = lambda message=None, domain=None, **kw: log.append(("push", message, domain))
        module.pop_range = lambda domain=None: log.append(("pop", domain))
        return module


def test_a_measured_call_with_nvtx_ranges_inside_the_capture_bracket(tmp_path):
    from dohnuts.model.build import resolve_source

    log = []
    cfg, _ = resolve_source("tiny")
    run = RunContext(run_id="r", run_dir=tmp_path, device=CUDA, hwspec=None, console=None, nvtx=True)
    spec = SimpleNamespace(name="w", kind="text", file="w.yaml", file_hash="0", model="tiny")
    tspec = SimpleNamespace(label="matmul", name="matmul", options={})
    ctx = TargetContext(run, spec, tspec, CUDA, torch.float32, cfg, {"device": {"name": "gpu"}}, TelemetryThread([]),
                        ranks={}, stage_ranges=NvtxRanges(_nvtx_module(log)))
    target = MatmulTarget()
    measure_call(ctx, target, None, -1, phase="first-call")
    records = []
    with measured_window(CUDA):  # cudaProfilerStart / Stop: nothing attached, nothing changes
        for i in range(3):
            twin = untimed_call_ms(ctx, target, None)
            records.append(measure_call(ctx, target, None, i, twin_ms=twin))
    torch.cuda.synchronize()
    for rec in records:
        assert rec.harness_overhead.nvtx is True and rec.harness_overhead.untimed_twin_ms > 0
        assert set(rec.stages) == {"h2d", "forward"}
        assert all(s.device_ms > 0 and s.count == 1 for s in rec.stages.values())
        assert rec.stages["forward"].device_ms <= rec.wall_ms
    assert run.measured["harness_calibration"][str(CUDA)]["nvtx"] is True
    if log:  # the stand-in: every range opened was closed, in the domain dohnuts
        assert [e for e in log if e[0] == "push"] and len([e for e in log if e[0] == "push"]) == len(
            [e for e in log if e[0] == "pop"])
        assert {e[-1] for e in log} == {"dohnuts"}
