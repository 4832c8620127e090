"""What a user sees while dohnuts-bench works: status and progress on stderr through `logging`
(plain lines with a heartbeat in a pipe), the report alone on stdout; Ctrl-C before the first call
keeps nothing and claims nothing; `analyze` never writes beside its input; a CPU run on one
thread by default, with the machine's load and the ceilings' stability in its report."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report.status import MeasureProgress, configure_logging

ROOT = Path(__file__).resolve().parents[2]
SMALL = """\
kind: text
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 3
halfwidth: 0
shape: {requests: 1, questions: 1, seq_tokens: 64, candidates: 2, candidate_tokens: 2}
"""
STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d) ")


def test_the_heartbeat_says_what_is_measured_at_least_every_interval(capsys):
    configure_logging(terminal=False)
    with MeasureProgress(every_s=0.2) as progress:
        task = progress.add_task("text · dohnuts", total=5)
        progress.advance(task, 2)
        time.sleep(0.9)
    lines = capsys.readouterr().err.splitlines()
    assert STAMP.match(lines[0]) and lines[0].endswith("measuring text · dohnuts (at least 5 calls)")
    beats = [line for line in lines if "still measuring text · dohnuts: 2/5 calls" in line]
    assert len(beats) >= 2, lines  # 0.9 s at one line per 0.2 s
    with MeasureProgress(enabled=False) as progress:  # --quiet: nothing at all
        progress.add_task("x", total=1)
        time.sleep(0.3)
    assert capsys.readouterr().err == ""


def test_warnings_say_so_and_quiet_leaves_only_them(capsys):
    from dohnuts.bench.report.status import log

    configure_logging(terminal=False, quiet=True)
    log.info("status")
    log.warning("something")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.match(r"^\d\d:\d\d:\d\d warning: something$", err[0])
    configure_logging(terminal=False)
    assert logging.getLogger("dohnuts.bench").level == logging.INFO


def test_a_terminal_stamps_the_time_alone_never_a_date():
    """rich's handler stamps `[12/04/26 11:05:57]` by default (month/day or day/month, as the locale
    reads it); ours stamps the ISO 8601 time alone, as the plain lines do."""
    import io

    from rich.console import Console

    from dohnuts.bench.report.status import log

    handler = configure_logging(terminal=True)
    try:
        handler.console = Console(file=io.StringIO(), width=100, color_system=None)
        before = time.localtime()
        log.info("status line")
        after = time.localtime()
        (line,) = handler.console.file.getvalue().splitlines()
    finally:
        configure_logging(terminal=False)
    stamp = re.match(r"^\[(\d\d):(\d\d):(\d\d)\] +INFO +status line", line)
    assert stamp, line
    seconds = lambda t: t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec  # noqa: E731
    h, m, sec = map(int, stamp.groups())
    assert seconds(before) <= h * 3600 + m * 60 + sec <= seconds(after) or seconds(after) < seconds(before)  # midnight


@pytest.mark.slow
def test_a_run_in_a_pipe_has_status_and_heartbeats_on_stderr_and_the_report_alone_on_stdout(tmp_path):
    """`dohnuts-bench run | cat`: never more than 10 s without a line on stderr from the first
    line to the report (the ceilings included), every ceiling logged as measured, and stdout
    holds the report and nothing of the status."""
    workload = tmp_path / "small.yaml"
    workload.write_text(SMALL)
    done = subprocess.run([sys.executable, "-m", "dohnuts.bench.cli", "run", str(workload), "--out",
                           str(tmp_path / "runs"), "--store", str(tmp_path / "store.sqlite")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    err = [line for line in done.stderr.splitlines() if STAMP.match(line)]
    assert any("load when the run started" in line for line in err)
    for key in ("fp32_matmul", "bf16_matmul", "fp32_vector", "device_copy"):
        assert any(f"ceiling {key}:" in line for line in err), key
    assert any("measuring small · dohnuts" in line for line in err)
    seconds = []
    for line in err:
        h, m, s = map(int, STAMP.match(line).groups())
        seconds.append(h * 3600 + m * 60 + s)
    gaps = [b - a for a, b in zip(seconds, seconds[1:])]
    assert max(gaps) <= 10, list(zip(gaps, err[1:]))
    assert "Measured calls" in done.stdout and "This run's machine" in done.stdout
    assert "A CPU run shows" in done.stdout and "It cannot show" in done.stdout
    assert not any(STAMP.match(line) for line in done.stdout.splitlines())  # no status line in the report
    assert "measuring small · dohnuts" not in done.stdout and "ceiling fp32_matmul" not in done.stdout


class _InterruptPrepare:
    @hookimpl
    def dohnuts_bench_prepare_run(self, run):
        raise KeyboardInterrupt  # Ctrl-C while the ceilings are measured


def test_ctrl_c_while_the_ceilings_are_measured_keeps_no_run_and_claims_no_results(tmp_path, monkeypatch, capsys):
    from dohnuts.bench import plugins

    real = plugins.plugin_manager
    monkeypatch.setattr(plugins, "plugin_manager", lambda extra=(): real(extra=(_InterruptPrepare(), *extra)))
    workload = tmp_path / "small.yaml"
    workload.write_text(SMALL)
    assert main(["run", str(workload), "--out", str(tmp_path / "runs"), "--store", str(tmp_path / "s.sqlite"),
                 "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "interrupted before the first call was recorded: nothing was measured" in err
    assert "results.jsonl" not in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_analyze_never_writes_beside_its_input(tmp_path, capsys, monkeypatch):
    """A committed run re-analysed: its folder is left as it was; the report files go to a new
    temporary folder named on stderr, or to --out."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the new folder under this test's own
    run = tmp_path / "committed"
    shutil.copytree(ROOT / "tests" / "bench" / "fixtures" / "cpu-gloo-4", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["analyze", str(run)]) == 0
    captured = capsys.readouterr()
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    (line,) = [line for line in captured.err.splitlines() if "report files:" in line]
    folder = Path(line.split("report files: ")[1].split(" (")[0])
    assert folder != run and (folder / "report.txt").is_file() and (folder / "summary.json").is_file()
    assert "Scaling" in (folder / "report.txt").read_text() and "Measured calls" in captured.out
    shutil.rmtree(folder)
    assert main(["analyze", str(run), "--out", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "report.txt").is_file() and "report files:" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_cpu_run_measures_on_one_thread_by_default_and_gives_the_process_its_threads_back(tmp_path, monkeypatch):
    import functools

    import torch

    from dohnuts.bench.measure import machine_id
    from dohnuts_bench_plugins.analyzers import microbench

    monkeypatch.setattr(microbench, "measure_cpu_ceilings",
                        functools.partial(microbench.measure_cpu_ceilings, n=128, copy_bytes=1 << 20, vector=1 << 12))
    workload = tmp_path / "small.yaml"
    workload.write_text(SMALL)
    threads = torch.get_num_threads()
    for flag, expected in (([], 1), (["--threads", "2"], 2)):
        out = tmp_path / f"runs{expected}"
        assert main(["run", str(workload), "--out", str(out), "--store", str(tmp_path / "s.sqlite"), "--quiet",
                     *flag]) == 0
        assert torch.get_num_threads() == threads
        (run,) = list(out.iterdir())
        meta = json.loads((run / "run.json").read_text())
        assert meta["provenance"]["device"]["threads"] == expected
        assert meta["measured"]["machine"]["id"].endswith(f"-{expected}thread" + ("s" if expected > 1 else ""))
        assert meta["measured"]["machine"]["threads"] == expected
        assert meta["measured"]["machine"]["cpu_model"] == machine_id.cpu_model()  # what host stages follow
        record = json.loads((run / "results.jsonl").read_text().splitlines()[0])
        assert any("load" in row for row in record["telemetry"])
        entry = meta["measured"]["ceilings"]["fp32_matmul"]
        assert len(entry["repeat_values"]) == 7 and entry["value"] == max(entry["repeat_values"])
    assert main(["run", str(workload), "--threads", "0", "--out", str(tmp_path / "x")]) == 2


def test_the_report_gives_the_load_and_flags_a_ceiling_that_moved():
    from rich.console import Console, Group

    from dohnuts.bench.analysis.machine import machine_conditions, machine_renderables
    from dohnuts_bench_plugins.analyzers.microbench import stability
    from tests.bench.typed_records import typed

    def record(target, others):
        return typed({"workload": {"name": "text"}, "target": target, "device": {"type": "cpu", "name": "x86_64"},
                      "telemetry": [{"load": {"others_cores": o, "load1": 3.0, "cpus": 2}} for o in others]})

    records = [record("dohnuts", [1.5, 1.7, 1.6]), record("quiet", [0.0, 0.1, 0.05])]
    measured = {"machine": {"cpus": 2, "threads": 1, "before": {"others_cores": 1.2, "load1": 3.1, "cpus": 2}},
                "ceilings": {"fp32_matmul": {"value": 2e10, "unit": "FLOP/s", **stability([2e10, 1.9e10, 1.95e10])},
                             "fp32_vector": {"value": 1e10, "unit": "FLOP/s", **stability([1e10, 6.55e7, 9e9])}}}
    c = machine_conditions(records, measured)
    assert c.unstable == ("fp32_vector",)
    assert {g.target: g.others_cores_median for g in c.groups} == {"dohnuts": 1.6, "quiet": 0.05}
    (busy, moved) = c.warnings
    assert "text · dohnuts 1.60" in busy and "text · quiet" not in busy
    assert "fp32_vector (moved 99% between its 3 repeats)" in moved
    console = Console(record=True, width=200)
    console.print(Group(*machine_renderables(c)))
    text = console.export_text()
    assert "a CPU run with 1 torch thread(s) of 2 cores" in text
    # what a CPU run can and cannot show opens the report (the headline), not this section at its end
    assert "A CPU run shows" not in text and "can and cannot show opens the report (the headline)" in text
    assert "NO: moved" in text and "1.20 cores busy (load average 3.10)" in text
    assert machine_conditions([], {}).warnings == ()  # a run recorded before the load sampler: nothing to say


def test_a_gpu_runs_machine_section_names_its_host_cpu_escaped():
    """A GPU run's host stages and a host-bound peer follow the host's CPU: the section names it (run.json
    `measured.machine.cpu_model`), a hostile model escaped; a run recorded before it was kept, nothing."""
    from dohnuts.bench.analysis.machine import machine_conditions, opening_lines
    from tests.bench.typed_records import typed

    rec = typed({"workload": {"name": "text"}, "target": "dohnuts", "device": {"type": "cuda", "name": "NVIDIA H200"}})
    c = machine_conditions([rec], {"machine": {"cpus": 16, "cpu_model": "AMD EPYC 9654\x1b[2J 96-Core"}})
    (line, *_) = opening_lines(c.to_dict())
    assert line.startswith("The host: AMD EPYC 9654\\x1b[2J 96-Core, 16 logical cores.") and "\x1b" not in line
    assert "host-bound target" in line
    assert not any("The host" in x for x in opening_lines(machine_conditions([rec], {"machine": {"cpus": 16}}).to_dict()))
