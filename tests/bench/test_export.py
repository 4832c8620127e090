"""`dohnuts-bench schema` and `dohnuts-bench export`, each output read back by its consumer's own rules:
the pytest-benchmark file by pytest-benchmark's storage, statistics and `compare` command (and by
`dohnuts-bench gate`, which reads pytest-benchmark files), the PyTorch benchmark-database records
by the v3 schema the export module documents (`PyTorchRecord`, unknown fields refused), the CSV by
the csv module and its header; the schemas against the readers they are generated from. The run
exported is the committed CPU standard suite (tests/bench/fixtures/cpu-standard-suite)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import yaml

from dohnuts.bench.analysis.records import MAX_MS, CallRecord, check_reportable, read_jsonl, read_records, stage_ms
from dohnuts.bench.analysis.summary import summarize
from dohnuts.bench.cli import main
from dohnuts.bench.commands.schema import record_schema, workload_schema
from dohnuts.bench.measure.workload import WorkloadFile
from dohnuts.bench.report.export_formats import CSV_COLUMNS, PyTorchRecord, per_call_groups

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-standard-suite"


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(FIXTURE, d)
    return d


@pytest.fixture(scope="module")
def records() -> list[CallRecord]:
    return read_records(FIXTURE / "results.jsonl.gz")


def _export(run: Path, fmt: str, out: Path) -> Path:
    assert main(["export", "--format", fmt, str(run), "--out", str(out)]) == 0
    return out


# -- schema --------------------------------------------------------------------------------------------


def test_schema_prints_what_msgspec_generates_from_the_readers(capsys):
    assert main(["schema", "record"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(record_schema()))
    assert main(["schema"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert set(both) == {"record", "workload"}
    required = both["record"]["$defs"]["ReportedRecord"]["required"]
    assert required[:4] == ["run_id", "workload", "target", "iteration"] and "wall_ms" in required


def test_the_record_schema_states_the_bounds_the_reader_enforces(records):
    props = record_schema()["$defs"]["ReportedRecord"]["properties"]
    assert props["wall_ms"] == {"type": "number", "exclusiveMinimum": 0.0, "maximum": MAX_MS}
    rec = records[1]
    check_reportable(rec)  # a committed record is within every bound
    for value, ok in ((0.0, False), (MAX_MS, True), (MAX_MS * 1.01, False), (1e-9, True)):
        bad = msgspec.structs.replace(rec, wall_ms=value)
        if ok:
            check_reportable(bad)
        else:
            with pytest.raises(Exception, match="wall_ms"):
                check_reportable(bad)
    assert props["precision"] == {"enum": ["bf16", "fp32"]}
    with pytest.raises(Exception, match="precision"):
        check_reportable(msgspec.structs.replace(rec, precision="fp16"))


def test_the_workload_schema_types_every_field_of_the_standard_suite():
    schema = workload_schema()
    defs = schema["$defs"]
    fields = defs["WorkloadFile"]["properties"]
    assert fields["repeat"] == {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 5}
    shapes = {rule["if"]["properties"]["kind"]["const"]: rule["then"]["properties"]["shape"]["$ref"].split("/")[-1]
              for rule in schema["allOf"][1:]}
    assert {"text", "shared-prefix", "image", "image-cache", "train-step"} <= set(shapes)
    files = sorted((ROOT / "workloads").rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        data = yaml.safe_load(path.read_text())
        assert set(data) <= set(fields), path
        msgspec.convert({k: v for k, v in data.items() if v is not None}, WorkloadFile)  # the reader agrees
        shape = defs[shapes[data["kind"]]]["properties"]
        assert set(data.get("shape") or {}) | set((data.get("on_gpu") or {}).get("shape") or {}) <= set(shape), path
        for key, value in (data.get("serving") or {}).items():
            assert key in defs["ServingFields"]["properties"], (path, key)


def test_schema_out_writes_the_file(tmp_path, capsys):
    out = tmp_path / "workload.schema.json"
    assert main(["schema", "workload", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "dohnuts-bench workload file"
    assert main(["schema", "--out", "/dev/full"]) == 2
    assert "character device" in capsys.readouterr().err


# -- pytest-benchmark ----------------------------------------------------------------------------------


def test_pytest_benchmark_reads_the_export_with_its_own_storage_and_statistics(run_dir, records, tmp_path):
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.stats import Stats
    from pytest_benchmark.storage.file import FileStorage

    out = _export(run_dir, "pytest-benchmark", tmp_path / "bench.json")
    storage = FileStorage(tmp_path / "storage", logger=Logger(Logger.QUIET))
    loaded = list(storage.load_benchmarks(str(out)))
    groups = per_call_groups(records)
    assert [b["name"] for b in loaded] == [f"{w}[{t}]" for w, t in groups]
    summary = {(r["workload"], r["target"]): r for r in summarize(records)}
    for bench, ((workload, target), recs) in zip(loaded, groups.items()):
        assert bench["data"] == [r.wall_ms / 1e3 for r in recs]  # seconds, measured order
        own = Stats()
        for x in bench["data"]:
            own.update(x)
        for field in Stats.fields:
            expected = getattr(own, field)
            assert bench[field] == (expected if isinstance(expected, str) else pytest.approx(expected, rel=1e-12)), \
                (bench["name"], field)
        assert bench["median"] * 1e3 == pytest.approx(summary[(workload, target)]["wall_median_ms"], rel=1e-12)
        assert bench["group"] == workload and bench["params"] == {"workload": workload, "target": target}


def test_pytest_benchmark_compare_and_the_gate_read_the_export(run_dir, records, tmp_path):
    from dohnuts.bench.commands.gate import timings

    out = _export(run_dir, "pytest-benchmark", tmp_path / "0001_export.json")
    done = subprocess.run([str(Path(sys.executable).parent / "pytest-benchmark"), "compare", str(out),
                           "--columns=min,median,max", "--csv", str(tmp_path / "compare")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Failed to load" not in done.stdout + done.stderr
    with open(tmp_path / "compare.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    groups = per_call_groups(records)
    assert len(rows) == len(groups)
    medians = {f"{w}[{t}]": statistics.median(r.wall_ms / 1e3 for r in recs) for (w, t), recs in groups.items()}
    for row in rows:  # pytest-benchmark's own CSV of the file it read
        assert float(row["median"]) == pytest.approx(medians[row["name"].removeprefix("dohnuts-bench::")], rel=1e-9)
    got = timings(out)  # dohnuts-bench gate's reader of pytest-benchmark files
    assert got == {f"{w}[{t}]": [r.wall_ms / 1e3 for r in recs] for (w, t), recs in groups.items()}


# -- PyTorch's benchmark database --------------------------------------------------------------------------


def test_the_pytorch_export_decodes_as_the_documented_v3_schema(run_dir, records, tmp_path):
    out = _export(run_dir, "pytorch", tmp_path / "pytorch.json")
    got = msgspec.json.decode(out.read_bytes(), type=list[PyTorchRecord])  # unknown fields refused
    groups = per_call_groups(records)
    by_metric = {(r.model.name, r.model.backend, r.metric.name): r for r in got}
    steady = {k: v for k, v in groups.items() if "·" not in k[1]}
    for (workload, target), recs in steady.items():
        walls = [r.wall_ms for r in recs]
        assert by_metric[(workload, target, "wall_ms")].metric.benchmark_values == walls
        assert by_metric[(workload, target, "median_wall_ms")].metric.benchmark_values == [statistics.median(walls)]
        assert by_metric[(workload, target, "std_wall_ms")].metric.benchmark_values[0] == pytest.approx(
            statistics.stdev(walls), rel=1e-9)
        rate = statistics.median(r.decisions for r in recs) / (statistics.median(walls) / 1e3)
        assert by_metric[(workload, target, "decisions_per_s")].metric.benchmark_values[0] == pytest.approx(rate)
        record = by_metric[(workload, target, "wall_ms")]
        assert record.benchmark.mode == ("training" if recs[0].workload.kind == "train-step" else "inference")
        assert record.benchmark.dtype == "float32" and record.model.extra_info["model"] == "tiny"
        assert record.runners[0].name == "cpu" and record.runners[0].cpu_count == 2
    first_calls = [r for r in got if r.metric.name == "first_call_wall_ms"]
    assert len(first_calls) == sum("first-call" in t for _, t in groups)
    assert all(math.isfinite(v) for r in got for v in r.metric.benchmark_values)


def test_the_v3_schema_refuses_what_the_database_would(tmp_path):
    good = {"benchmark": {"name": "b"}, "model": {"name": "m"}, "metric": {"name": "x", "benchmark_values": [1.0]}}
    msgspec.convert([good], list[PyTorchRecord])
    for bad in ({**good, "metric": {"name": "x"}}, {**good, "model": {}}, {**good, "extra": 1},
                {**good, "metric": {"name": "x", "benchmark_values": []}}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert([bad], list[PyTorchRecord])


# -- CSV -----------------------------------------------------------------------------------------------


def test_the_csv_holds_one_row_a_record_under_its_header(run_dir, records, tmp_path):
    out = _export(run_dir, "csv", tmp_path / "run.csv")
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    stages = list(dict.fromkeys(f"stage_ms:{s}" for r in records for s in r.stages))
    assert reader.fieldnames == [*CSV_COLUMNS, *stages]
    assert len(rows) == len(records)
    for row, rec in zip(rows, records):
        assert float(row["wall_ms"]) == rec.wall_ms  # repr round-trips exactly
        assert row["workload"] == rec.workload.name and row["phase"] == rec.phase
        assert row["iteration"] == str(rec.iteration) and row["valid"] == "true"
        for name, entry in rec.stages.items():
            assert float(row[f"stage_ms:{name}"]) == stage_ms(entry)
        assert all(row[s] == "" for s in stages if s.split(":", 1)[1] not in rec.stages)


def test_hostile_names_reach_the_csv_inert(tmp_path, capsys):
    run = tmp_path / "hostile"
    run.mkdir()
    name = '=HYPERLINK("http://x")\x1b[31m\nred'
    plain = read_jsonl(FIXTURE / "results.jsonl.gz")[:3]
    lines = [json.dumps({k: v for k, v in r.items() if k != "_source"} | {"workload": r["workload"] | {"name": name}})
             for r in plain]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["export", "--format", "csv", str(run)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\n".join(text.splitlines()) == text.rstrip("\n")  # no raw control character
    rows = list(csv.DictReader(text.splitlines()))
    assert len(rows) == 3
    assert all(r["workload"] == "'" + '=HYPERLINK("http://x")\\x1b[31m\\nred' for r in rows)


# -- the output path -------------------------------------------------------------------------------------


def test_an_export_never_overwrites_the_run_it_reads(run_dir, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    os.symlink(run_dir / "run.json", tmp_path / "link.json")
    os.link(run_dir / "results.jsonl.gz", tmp_path / "hard.gz")
    for out in (run_dir / "results.jsonl.gz", run_dir / "run.json", run_dir / "results.jsonl",
                run_dir / "summary.json", tmp_path / "link.json", tmp_path / "hard.gz"):
        assert main(["export", "--format", "csv", str(run_dir), "--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert "never overwrites its input" in err and err.count("\n") == 1, err
    for out, what in (("/dev/full", "character device"), (str(tmp_path), "directory")):
        assert main(["export", "--format", "csv", str(run_dir), "--out", out]) == 2
        assert what in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert gzip.decompress((tmp_path / "hard.gz").read_bytes())  # still the archive
    # beside the run, under a name of its own: written
    assert main(["export", "--format", "csv", str(run_dir), "--out", str(run_dir / "export.csv")]) == 0
    assert main(["export", "--format", "csv", str(run_dir / "results.jsonl.gz")]) == 0
    assert capsys.readouterr().out == (run_dir / "export.csv").read_text()


@pytest.mark.parametrize("n", range(1, 14))
def test_the_quartile_rule_is_pytest_benchmarks_at_every_count(n):
    """Every branch of pytest-benchmark's quartiles (n = 1, odd 4k+1 and 4k+3, even) and its fences."""
    import numpy as np
    from pytest_benchmark.stats import Stats

    from dohnuts.bench.report.export_formats import pytest_benchmark_stats

    data = list(np.random.default_rng(n).lognormal(0, 1, n))
    own = Stats()
    for x in data:
        own.update(x)
    got = pytest_benchmark_stats(data)
    assert got == {f: getattr(own, f) if isinstance(getattr(own, f), (str, int)) else pytest.approx(getattr(own, f))
                   for f in Stats.fields}
