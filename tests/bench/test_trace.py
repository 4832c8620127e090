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
    assert "grouped by the operators' input shapes" in ops  # which operator moved which tensor
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


def test_stage_kernels_places_each_kernel_by_the_stage_range_on_the_device():
    """Hand-built trace, 2 calls: kernels inside a stage's device range count to it (a graph's
    kernels have no launching operator, only a time); one outside every range is said apart; each
    stage's idle device time and its longest gap."""
    from dohnuts.bench.measure.trace import stage_kernels, stage_kernels_text

    def ev(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        ev("gpu_user_annotation", "dohnuts:forward", 0, 100), ev("gpu_user_annotation", "dohnuts:backward", 100, 300),
        ev("gpu_user_annotation", "dohnuts:forward", 1000, 100), ev("user_annotation", "dohnuts:forward", 0, 5000),
        ev("kernel", "gemm", 10, 60), ev("kernel", "gemm", 1010, 60), ev("gpu_memcpy", "Memcpy DtoD", 80, 20),
        ev("kernel", "gemm", 120, 200), ev("gpu_memset", "Memset", 399, 1), ev("kernel", "late", 400, 40),
        ev("cpu_op", "aten::mm", 10, 60)]}
    got = stage_kernels(trace, calls=2)
    rounded = {s: {"ms": round(e["ms"], 6), "kernels": {k: round(v, 6) for k, v in e["kernels"].items()}}
               for s, e in got.items()}
    assert rounded == ({"forward": {"ms": 0.07, "kernels": {"gemm": 0.06, "Memcpy DtoD": 0.01}},
                   "backward": {"ms": 0.1005, "kernels": {"gemm": 0.1, "Memset": 0.0005}},
                   "(outside the stages)": {"ms": 0.02, "kernels": {"late": 0.02}}})
    # Each stage's ranges per call and what no kernel ran of them (hand-computed): forward's two
    # ranges of 100 µs hold 60 + 20 and 60 µs of kernels, its longest gap the 30 µs after the second
    # gemm; backward's 300 µs hold 200 + 1 µs, the 79 µs between the gemm and the memset.
    assert {s: (round(e["range_ms"], 6), round(e["idle_ms"], 6), e["gap"]) for s, e in got.items() if "range_ms" in e} \
        == {"forward": (0.1, 0.03, {"us": 30, "after": "gemm", "before": "the range's end"}),
            "backward": (0.15, 0.0495, {"us": 79, "after": "gemm", "before": "Memset"})}
    assert "range_ms" not in got["(outside the stages)"]
    text = stage_kernels_text(got)
    assert text.splitlines()[1:3] == [
        "backward: 0.101 ms of kernels in a 0.150 ms range, 0.050 ms idle (the longest gap 79.0 µs, after gemm, "
        "before Memset)", "        0.100 ms   99.5%  gemm"]
    # kernels on two streams at once count once; one that runs past its range's end, to the end
    both = {"traceEvents": [ev("gpu_user_annotation", "dohnuts:shared", 0, 100), ev("kernel", "a", 0, 60),
                            ev("kernel", "b", 20, 30), ev("kernel", "c", 70, 50)]}
    shared = stage_kernels(both, calls=1)["shared"]
    assert round(shared["idle_ms"], 6) == 0.01 and shared["gap"] == {"us": 10, "after": "a", "before": "c"}
