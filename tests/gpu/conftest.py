"""Every GPU test runs where the fused kernels run: a device whose probe failed takes every op's
reference path (dohnuts.ops._dispatch), and a GPU test on it would compare the reference with
itself, passing or failing for no reason about the kernels. So each test first checks the
verdict (probing the device if no op has yet) and fails with its reason.

Each GPU test also reports as it ends — outcome, seconds, and a failure's last line — because a
run stopped by the lease's time limit prints no summary: twice a killed run returned only its
progress dots, and which tests failed, and where the minutes went, were lost."""

from __future__ import annotations

import os
import sys

import pytest
import torch


@pytest.fixture(autouse=True)
def _fused_kernels_run_here():
    from dohnuts.ops._dispatch import kernel_status

    status = kernel_status(torch.device("cuda"))
    assert status == "fused", f"the GPU tests need the fused kernels; this device: {status}"
    yield
    status = kernel_status(torch.device("cuda"))
    assert status == "fused", f"a test left the device on the reference paths: {status}"


def pytest_runtest_logreport(report):
    """One line per GPU test as it ends (setup failures too), on the terminal at once. (A
    conftest's report hook sees every test of the session: the others are left alone.)"""
    if not report.nodeid.startswith("tests/gpu/") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist the controller, which receives every worker's reports, prints
    if report.when != "call" and not (report.when == "setup" and report.failed):
        return
    line = f"[gpu test] {report.outcome:7s} {report.duration:7.1f} s  {report.nodeid}"
    if report.failed:
        last = str(report.longrepr).strip().splitlines()[-1:] or [""]
        line += f"  | {last[0][:200]}"
    print(f"\n{line}", file=sys.__stdout__, flush=True)
