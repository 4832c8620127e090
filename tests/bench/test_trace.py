"""`dohnuts-bench run --profile`: a torch.profiler trace a workload and target, in gzipped Chrome
JSON (what Perfetto opens), holding every harness stage of the profiled calls as a named range —
and the profiled calls are not measurements (the records are those of an unprofiled run)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.runtime.timing import StageTimer

WORKLOAD = """kind: text
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 2
shape: {requests: 1, questions: 2, seq_tokens: 48, candidates: 2, candidate_tokens: 2}
"""


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_profiled_run_writes_a_trace_with_the_stage_names(tmp_path):
    wl = tmp_path / "text-trace.yaml"
    wl.write_text(WORKLOAD)
    assert main(["run", str(wl), "--out", str(tmp_path / "runs"), "--quiet", "--profile"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    (entry,) = meta["traces"]
    assert entry["workload"] == "text-trace" and entry["target"] == "dohnuts" and entry["calls"] == 3
    path = run_dir / entry["path"]
    assert path.name.endswith(".json.gz") and path.parent.name == "traces"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)  # Chrome trace JSON: what Perfetto and chrome://tracing read
    names = {e.get("name") for e in trace["traceEvents"] if e.get("ph") == "X"}
    records = _records(run_dir)
    stages = {name for r in records if r["phase"] == "steady" for name in r["stages"]}
    assert stages and {f"dohnuts:{s}" for s in stages} <= names
    assert {f"dohnuts call {i}" for i in range(3)} <= names
    # beside it, the profiler's operator table: the stages and the model's operators by self time
    ops = (path.parent / path.name.replace(".json.gz", ".ops.txt")).read_text()
    assert "self_cpu_time_total" in ops.splitlines()[0] and "Self CPU" in ops
    assert "dohnuts:forward" in ops and "aten::" in ops
    # the profiled calls left no record: one first call, the measured calls numbered 0..n-1, the stream
    steady = [r["iteration"] for r in records if r["phase"] == "steady"]
    assert steady == list(range(len(steady))) and len(steady) >= 2
    assert sum(r["phase"] == "first-call" for r in records) == 1
    assert sum(r["phase"] == "stream" for r in records) == 2
    assert len(records) == 1 + len(steady) + 2
    # the first measured calls each followed an untimed twin (the harness's A/B from outside)
    twins = [r["iteration"] for r in records if "untimed_twin_ms" in (r.get("harness_overhead") or {})]
    assert twins == steady[:8]
    assert "traces/" in (run_dir / "report.html").read_text()


def test_a_stage_is_a_named_range_only_when_asked():
    """Profiled calls name their stages; measured calls (the default timer) carry no range."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def names(timer):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with timer.stage("forward"):
                torch.ones(4).sum()
        return {e.name for e in prof.events()}

    assert "dohnuts:forward" in names(StageTimer(torch.device("cpu"), ranges=True))
    assert "dohnuts:forward" not in names(StageTimer(torch.device("cpu")))
