"""The exported traces as other tools read them (issue 49): the telemetry as Chrome-trace counter
tracks on the trace's own clock, and a multi-process `--profile` run's traces one a rank, each with
`distributedInfo`, in one folder a workload and target — read here by HolisticTraceAnalysis's
rule for finding ranks (hta/common/trace_file.py: every `.gz`/`.json` file of the folder carries
`distributedInfo.rank`, a distinct non-negative int)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from dohnuts.bench.calls import CallResult
from dohnuts.bench.measure.trace import profile_calls, telemetry_counters, trace_clock_offset_us
from dohnuts.runtime.work import WorkCounts

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _call_range(i: int, ts: float, pid=7) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"dohnuts call {i}", "ts": ts, "dur": 500.0, "pid": pid,
            "tid": 1}


def test_counters_by_hand():
    """Calls 0 and 1 opened 2 µs and 4 µs after the clock reads at 5.0 s and 5.01 s (perf_counter):
    the offset is their median (3 µs past the reads), so a sample 1 ms after t0 = 4.999 s (the first
    read's instant) lands at 1000 + 3 µs on the trace's clock, one 10 ms later at 11003 µs."""
    trace = {"traceEvents": [_call_range(0, 1000.0 + 2), _call_range(1, 1000.0 + 10_000 + 4),
                             {"ph": "X", "cat": "gpu_user_annotation", "name": "dohnuts call 0", "ts": 0.0, "dur": 1}]}
    starts = [5.0, 5.01]
    offset, pid = trace_clock_offset_us(trace, starts)
    assert offset == pytest.approx(1000.0 + 3 - 5.0e6) and pid == 7  # the device's copy of the range is not used
    rows = [{"dt_ms": 1.0, "nvml": {"sm_clock_mhz": 1980, "power_w": 312.5, "throttled": False},
             "load": {"cpus": 2, "own_cores": 0.5}},
            {"dt_ms": 11.0, "nvml": {"error": "NVML: unknown"}, "load": {"cpus": 2, "own_cores": float("nan")}}]
    events = telemetry_counters(trace, rows, 4.999, starts)
    assert events == [
        {"ph": "C", "name": "dohnuts telemetry: nvml sm_clock_mhz", "pid": 7, "ts": pytest.approx(1003.0),
         "args": {"sm_clock_mhz": 1980}},
        {"ph": "C", "name": "dohnuts telemetry: nvml power_w", "pid": 7, "ts": pytest.approx(1003.0),
         "args": {"power_w": 312.5}},
        {"ph": "C", "name": "dohnuts telemetry: load cpus", "pid": 7, "ts": pytest.approx(1003.0), "args": {"cpus": 2}},
        {"ph": "C", "name": "dohnuts telemetry: load own_cores", "pid": 7, "ts": pytest.approx(1003.0),
         "args": {"own_cores": 0.5}},
        {"ph": "C", "name": "dohnuts telemetry: load cpus", "pid": 7, "ts": pytest.approx(11003.0),
         "args": {"cpus": 2}}]  # an error, a bool and a NaN are no readings
    assert telemetry_counters({"traceEvents": []}, rows, 4.999, starts) == []  # no call range: nothing placed


class TinyTarget:
    def run_call(self, call, timer):
        with timer.stage("forward"):
            torch.ones(64, 64) @ torch.ones(64, 64)
            time.sleep(0.003)
        return CallResult(decisions=1, work=WorkCounts(sequences=1, seq_lens=(8,), padded_len=8, candidates=2))


class FakeTelemetry:
    """A TelemetryThread's `window` with samples every 2 ms from t0, a GPU clock stepping down."""

    interval_s = 0.002

    def __init__(self):
        self.asked = None

    def window(self, t0, t1, limit=8):
        self.asked = (t0, t1)
        n = min(limit, int((t1 - t0) / self.interval_s) + 1)
        return [{"dt_ms": 2.0 * k, "nvml": {"sm_clock_mhz": 1980 - k, "power_w": 300.0 + k}} for k in range(n)]


def test_a_trace_holds_the_telemetry_as_counter_tracks_and_the_rank(tmp_path):
    telemetry = FakeTelemetry()
    path = tmp_path / "traces" / "w" / "t" / "rank1.json.gz"
    info = {"rank": 1, "world_size": 2, "backend": "gloo"}
    assert profile_calls(TinyTarget(), [None] * 3, CPU, path, telemetry, distributed=info) == 3
    with gzip.open(path, "rt") as f:
        trace = json.load(f)  # still Chrome-trace JSON
    assert trace["distributedInfo"]["rank"] == 1 and trace["distributedInfo"]["world_size"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank1.json.gz", "rank1.ops.txt"]
    calls = sorted((e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("dohnuts call ")),
                   key=lambda e: e["ts"])
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    tracks = {}
    for e in counters:  # the Chrome trace event format of a counter
        assert set(e) == {"ph", "name", "pid", "ts", "args"} and e["pid"] == calls[0]["pid"]
        assert isinstance(e["ts"], float) and all(isinstance(v, (int, float)) for v in e["args"].values())
        tracks.setdefault(e["name"], []).append(e)
    assert set(tracks) == {"dohnuts telemetry: nvml sm_clock_mhz", "dohnuts telemetry: nvml power_w"}
    clock = tracks["dohnuts telemetry: nvml sm_clock_mhz"]
    n = len(clock)
    assert n >= 3 and [e["args"]["sm_clock_mhz"] for e in clock] == [1980 - k for k in range(n)]
    # monotone, 2 ms (2000 µs) apart as the samples were: one clock mapped onto the other
    assert all(b["ts"] - a["ts"] == pytest.approx(2000.0) for a, b in zip(clock, clock[1:]))
    # the samples asked for surround the calls: from one interval before the first to one after the last
    t0, t1 = telemetry.asked
    assert t1 - t0 > 2 * telemetry.interval_s + 3 * 0.003


def _bench(tmp_path: Path, workload: dict, *flags: str, env: dict) -> tuple[subprocess.CompletedProcess, Path]:
    f = tmp_path / "ranks.yaml"
    f.write_text(yaml.safe_dump(workload))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "dohnuts.bench.cli", "run", str(f), "--out", str(out), "--quiet",
                           *flags], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, COLUMNS="120", OMP_NUM_THREADS="1", **env))
    runs = sorted(out.iterdir()) if out.exists() else []
    return proc, (runs[-1] if runs else out)


def hta_rank_files(folder: Path) -> dict[int, str]:
    """HTA's rank → trace file map of a folder (hta/common/trace_file.create_rank_to_trace_dict)."""
    ranks = {}
    for name in os.listdir(folder):
        if not (name.endswith(".gz") or name.endswith(".json")):
            continue
        opener = gzip.open if name.endswith(".gz") else open
        with opener(folder / name, "rt") as f:
            data = json.load(f)
        rank = data["distributedInfo"]["rank"]  # HTA raises without it
        assert isinstance(rank, int) and rank >= 0 and rank not in ranks
        ranks[rank] = name
    return ranks


@pytest.mark.slow(seconds=60)
def test_a_profiled_two_process_run_writes_a_trace_a_rank_as_hta_reads_them(tmp_path):
    """Two gloo ranks under `--profile --nvtx` (a fake nvtx package on the ranks' path): each writes
    its trace into RUN/traces/<workload>-p2/<target>/, which HTA's rule maps to ranks 0 and 1; run.json
    names the folder; the ranks' steady records carry the NVTX flag (`--nvtx` reached them)."""
    fake = tmp_path / "fake-nvtx" / "nvtx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def push_range(message=None, color=None, domain=None, **kw):\n    pass\n\n\n"
                                      "def pop_range(domain=None):\n    pass\n")
    workload = {"kind": "text", "model": "tiny", "warmup": 1, "repeat": 2, "halfwidth": 0, "processes": [2],
                "targets": ["dohnuts"],
                "shape": {"requests": 2, "questions": 2, "seq_tokens": 48, "candidates": 2, "candidate_tokens": 2}}
    path = os.pathsep.join([str(fake.parent), str(ROOT), os.environ.get("PYTHONPATH", "")])
    proc, run = _bench(tmp_path, workload, "--profile", "--nvtx", env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = json.loads((run / "run.json").read_text())
    (entry,) = meta["traces"]
    assert entry["ranks"] == 2 and entry["calls"] == 3 and entry["target"] == "dohnuts"
    folder = run / entry["path"]
    assert folder == run / "traces" / "ranks-p2" / "dohnuts"
    assert hta_rank_files(folder) == {0: "rank0.json.gz", 1: "rank1.json.gz"}
    for k in (0, 1):
        with gzip.open(folder / f"rank{k}.json.gz", "rt") as f:
            info = json.load(f)["distributedInfo"]
        assert info["world_size"] == 2 and info["backend"] == "gloo"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    steady = [r for r in records if r["phase"] == "steady"]
    assert {r["rank"] for r in steady} == {0, 1}
    assert all(r["harness_overhead"]["nvtx"] is True for r in steady)
    assert "2 ranks" in (run / "report.html").read_text()
