"""A finished run in the formats dashboards and other tools read (`dohnuts-bench export`:
dohnuts.bench.commands.export reads the run and writes the text).

One benchmark a summary row: the per-call groups of summary.json (a workload · target's valid
steady calls, its first call and its stream apart, as dohnuts.bench.analysis.summary.summarize
groups them; load points and accuracy records are not per-call groups).

- `pytest-benchmark`: the JSON a `pytest --benchmark-json` run writes (pytest-benchmark 4 and 5):
  `machine_info`, `commit_info`, `benchmarks[]` and `datetime`, `version`. A benchmark's `name` is
  `WORKLOAD[TARGET]`, its `group` the workload, `params` {workload, target}; `stats` holds every
  field pytest-benchmark writes (min max mean stddev rounds median iqr q1 q3 iqr_outliers
  stddev_outliers outliers ld15iqr hd15iqr ops total, `data` and `iterations` 1) in seconds, each
  by pytest-benchmark's own definition (pytest_benchmark.stats.Stats: `statistics.mean`, `stdev`
  and `median`, its quartile rule — Wikipedia's method 3 for an odd count, method 2 for an even
  one), so `pytest-benchmark compare FILE` and `dohnuts-bench gate` read it as one of their own.
- `pytorch`: the PyTorch OSS benchmark database's record format (its `v3` schema, the one
  `vllm bench --save-result` and PyTorch's own benchmarks upload): a JSON list, one record a
  metric, each `{benchmark: {name, mode, dtype, extra_info}, model: {name, type, backend, origins,
  extra_info}, metric: {name, benchmark_values, extra_info}, runners: [{name, type, cpu_info,
  cpu_count, gpu_info, gpu_count, avail_gpu_mem_in_gb, extra_info}]}`; `PyTorchRecord` below is
  that schema as this module writes it (what the tests read the file back with). `model.name` is
  the workload (the "test name" of the format; its model in `model.extra_info.model`),
  `model.backend` the target; the metrics a group are `wall_ms` (every call, measured order),
  `median_wall_ms`, `mean_wall_ms`, `std_wall_ms` and `decisions_per_s`, named with the phase
  first for a target's first call and its stream (`first_call_wall_ms`, `stream_wall_ms`, ...).
  Load points follow as `vllm bench serve` uploads them: benchmark `dohnuts-bench serving`, the
  point's rate or clients in its extra_info, a record a metric under vLLM's names (`mean_e2el_ms`,
  `p99_ttft_ms`, `median_queue_ms`, ..., `request_throughput`, `request_goodput`, `completed`).
  No `target_value` is written: the bound a call is judged by lives in the report, not in the
  records.
- `csv`: one row a record (every phase, the load points' served requests included), the columns
  `CSV_COLUMNS` and then one `stage_ms:NAME` column a stage (device time where recorded, else
  host time: the analysis's rule); an empty cell where a record has no such value. A text cell is
  printable (control characters written as escapes) and one that a spreadsheet would read as a
  formula (starting `=`, `+`, `-`, `@`) starts with `'`.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from bisect import bisect_left, bisect_right
from typing import Annotated, Any

import msgspec

from dohnuts import __version__
from dohnuts.bench.analysis.quantiles import mean_and_std
from dohnuts.bench.analysis.records import (
    CallRecord, group_key, per_call_records, stage_ms, target_label, valid_records, where, workload_label,
)
from dohnuts.bench.analysis.serving import load_curves
from dohnuts.schema import dumps, printable

FORMATS = ("pytest-benchmark", "pytorch", "csv")
BENCHMARK_NAME = "dohnuts-bench"


def per_call_groups(records: list[CallRecord]) -> dict[tuple[str, str], list[CallRecord]]:
    """The summary's per-call groups (workload, target) → valid records, in measured order."""
    kept, _ = valid_records(per_call_records(records))
    groups: dict[tuple[str, str], list[CallRecord]] = {}
    for r in kept:
        groups.setdefault(group_key(r), []).append(r)
    return groups


def _provenance(records: list[CallRecord], meta: dict) -> dict:
    p = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else None
    p = p or next((r.provenance for r in records if r.provenance is not None), {})
    return p


def _machine(meta: dict) -> dict:
    m = (meta.get("measured") or {}).get("machine") if isinstance(meta.get("measured"), dict) else None
    return m if isinstance(m, dict) else {}


def _started(meta: dict) -> str | None:
    timing = (meta.get("measured") or {}).get("timing") if isinstance(meta.get("measured"), dict) else None
    started = timing.get("process_started") if isinstance(timing, dict) else None
    return started if isinstance(started, str) else None


# -- pytest-benchmark --------------------------------------------------------------------------------


def _quartiles(xs: list[float]) -> tuple[float, float]:
    """(q1, q3) by pytest-benchmark's rule (pytest_benchmark.stats.Stats.q1 / q3): Wikipedia's
    quartile method 3 for an odd count, method 2 (the medians of the halves) for an even one. The
    file's own definition, not this project's quantile (dohnuts.bench.analysis.quantiles)."""
    n, d = len(xs), xs
    if n == 1:
        return d[0], d[0]
    if n % 2:
        k, r = n // 4, n % 4
        if r == 1:
            return 0.25 * d[k - 1] + 0.75 * d[k], 0.75 * d[3 * k] + 0.25 * d[3 * k + 1]
        return 0.75 * d[k] + 0.25 * d[k + 1], 0.25 * d[3 * k + 1] + 0.75 * d[3 * k + 2]
    return statistics.median(d[: n // 2]), statistics.median(d[n // 2:])


def pytest_benchmark_stats(data: list[float]) -> dict:
    """Every field of pytest-benchmark's `stats` over `data` (seconds), by its definitions."""
    xs = sorted(data)
    mean = statistics.mean(data)
    stddev = statistics.stdev(data) if len(data) > 1 else 0
    q1, q3 = _quartiles(xs)
    iqr = q3 - q1
    low, high = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    iqr_outliers = sum(1 for x in data if x < low or x > high)
    stddev_outliers = sum(1 for x in data if x < mean - stddev or x > mean + stddev)
    total = sum(data)
    single = len(data) == 1
    return {"min": xs[0], "max": xs[-1], "mean": mean, "stddev": stddev, "rounds": len(data),
            "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_outliers,
            "stddev_outliers": stddev_outliers, "outliers": f"{stddev_outliers};{iqr_outliers}",
            "ld15iqr": data[0] if single else xs[bisect_left(xs, low)],
            "hd15iqr": data[0] if single else xs[bisect_right(xs, high) - 1],
            "ops": len(data) / total if total else 0, "total": total}


def pytest_benchmark_json(records: list[CallRecord], meta: dict) -> dict:
    """The run as a pytest-benchmark JSON file (module docstring)."""
    prov, machine = _provenance(records, meta), _machine(meta)
    device = prov.get("device") if isinstance(prov.get("device"), dict) else {}
    platform_words = str(prov.get("platform", ""))
    machine_info = {
        "node": prov.get("host"), "processor": device.get("name") if device.get("type") == "cpu" else None,
        "machine": next((w for w in platform_words.split("-") if w in ("x86_64", "aarch64", "arm64")), None),
        "python_compiler": None, "python_implementation": "CPython", "python_implementation_version":
        prov.get("python"), "python_version": prov.get("python"), "python_build": None, "release": None,
        "system": platform_words.split("-")[0] or None, "cpu": {"count": machine.get("cpus")},
        # dohnuts-bench's own facts, kept beside pytest-benchmark's
        "dohnuts": {"machine_id": machine.get("id"), "device": device, "packages": prov.get("packages"),
                    "platform": prov.get("platform")}}
    git = str(prov.get("git") or "unknown")
    commit_info = {"id": git.removesuffix("+dirty"), "time": None, "author_time": None,
                   "dirty": git.endswith("+dirty"), "project": "dohnuts", "branch": None}
    benchmarks = []
    for (workload, target), recs in per_call_groups(records).items():
        data = [r.wall_ms / 1e3 for r in recs]  # seconds: pytest-benchmark's unit
        first = recs[0]
        benchmarks.append({
            "group": workload, "name": f"{workload}[{target}]", "fullname": f"{BENCHMARK_NAME}::{workload}[{target}]",
            "params": {"workload": workload, "target": target}, "param": target,
            "extra_info": {"run_id": first.run_id, "phase": first.phase,
                           "kind": first.workload.kind, "model": first.model_source,
                           "precision": first.precision, "device": first.device.name,
                           "decisions_median": statistics.median(r.decisions for r in recs)},
            "options": {"timer": "perf_counter", "disable_gc": False, "min_rounds": None, "max_time": None,
                        "min_time": None, "warmup": None},
            "stats": pytest_benchmark_stats(data) | {"data": data, "iterations": 1}})
    return {"machine_info": machine_info, "commit_info": commit_info, "benchmarks": benchmarks,
            "datetime": _started(meta), "version": f"{BENCHMARK_NAME} {__version__}"}


# -- PyTorch's benchmark database (v3) -----------------------------------------------------------------


class PyTorchBenchmark(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]  # required
    mode: str | None = None  # "training" or "inference"
    dtype: str | None = None
    extra_info: dict[str, Any] = {}


class PyTorchModel(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]  # required
    type: str | None = None
    backend: str | None = None
    origins: list[str] = []
    extra_info: dict[str, Any] = {}


class PyTorchMetric(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]  # required
    benchmark_values: Annotated[list[float], msgspec.Meta(min_length=1)]  # required
    target_value: float | None = None
    extra_info: dict[str, Any] = {}


class PyTorchRunner(msgspec.Struct, forbid_unknown_fields=True):
    name: str | None = None
    type: str | None = None
    cpu_info: str | None = None
    cpu_count: int | None = None
    avail_mem_in_gb: int | None = None
    gpu_info: str | None = None
    gpu_count: int | None = None
    avail_gpu_mem_in_gb: int | None = None
    extra_info: dict[str, Any] = {}


class PyTorchRecord(msgspec.Struct, forbid_unknown_fields=True):
    """One record of the PyTorch OSS benchmark database's v3 format, as this module writes it
    (`benchmark`, `model` and `metric` required; `runners` the machine)."""

    benchmark: PyTorchBenchmark
    model: PyTorchModel
    metric: PyTorchMetric
    runners: list[PyTorchRunner] = []


def pytorch_records(records: list[CallRecord], meta: dict) -> list[dict]:
    """The run in the PyTorch OSS benchmark database's v3 format (module docstring)."""
    prov, machine = _provenance(records, meta), _machine(meta)
    device = prov.get("device") if isinstance(prov.get("device"), dict) else {}
    gpu = device.get("type") == "cuda"
    memory = device.get("memory_bytes")
    runner = {"name": "rocm" if gpu and device.get("hip") else device.get("type"), "type": device.get("name"),
              "cpu_info": None if gpu else device.get("name"), "cpu_count": machine.get("cpus"),
              "gpu_info": device.get("name") if gpu else None, "gpu_count": 1 if gpu else 0,
              "avail_gpu_mem_in_gb": int(memory / 2**30) if gpu and isinstance(memory, int) else None,
              "extra_info": {"hostname": prov.get("host"), "machine_id": machine.get("id"),
                             "platform": prov.get("platform"), "git": prov.get("git")}}
    out = []
    for recs in per_call_groups(records).values():
        first = recs[0]
        phase = first.phase
        prefix = "" if phase == "steady" else phase.replace("-", "_") + "_"  # first_call_, stream_
        walls = [r.wall_ms for r in recs]
        median = statistics.median(walls)
        mean, std = mean_and_std(walls)
        decisions = statistics.median(r.decisions for r in recs)
        kind = first.workload.kind
        benchmark = {"name": BENCHMARK_NAME, "mode": "training" if kind == "train-step" else "inference",
                     "dtype": {"bf16": "bfloat16", "fp32": "float32"}[first.precision],
                     "extra_info": {"phase": phase, "run_id": first.run_id, "device": first.device.name}}
        model = {"name": workload_label(first), "type": str(kind), "backend": target_label(first),
                 "origins": ["dohnuts"],
                 "extra_info": {"model": first.model_source or first.model.get("name"),
                                "target_name": first.target_name, "variant": first.variant,
                                "config_hash": first.config_hash}}
        metrics = [("wall_ms", walls, "ms", "every call, in measured order"),
                   ("median_wall_ms", [median], "ms", "median call"),
                   ("mean_wall_ms", [mean], "ms", "mean call"),
                   ("std_wall_ms", [std] if std is not None else [], "ms", "sample standard deviation (ddof 1)"),
                   ("decisions_per_s", [decisions / (median / 1e3)], "1/s", "median decisions over the median call")]
        for name, values, unit, what in metrics:
            if values:
                out.append({"benchmark": benchmark, "model": model,
                            "metric": {"name": prefix + name, "benchmark_values": values,
                                       "extra_info": {"unit": unit, "statistic": what, "calls": len(recs)}},
                            "runners": [runner]})
    return out + _serving_records(records, runner)


def _serving_records(records: list[CallRecord], runner: dict) -> list[dict]:
    """The load points as vLLM uploads a serving run: a record a metric a point, the metrics under
    vLLM's names (`mean_e2el_ms`, `p99_ttft_ms`, ..., dohnuts.bench.measure.serving.stats) and
    `request_throughput`, `request_goodput`, `completed`; the point's rate or clients in
    `benchmark.extra_info`."""
    precision = {(workload_label(r), target_label(r)): r.precision for r in records}
    out = []
    for c in load_curves(records):
        model = {"name": c.workload, "type": "serving", "backend": c.target, "origins": ["dohnuts"], "extra_info": {}}
        dtype = {"bf16": "bfloat16", "fp32": "float32"}.get(precision.get((c.workload, c.target)))
        for p, role in zip(c.points, c.roles):
            load = ({"concurrency": p.concurrency, "think_ms": c.think_ms} if c.closed_loop
                    else {"request_rate": p.rate_rps if math.isfinite(p.rate_rps) else None})
            benchmark = {"name": f"{BENCHMARK_NAME} serving", "mode": "inference", "dtype": dtype,
                         "extra_info": {"scenario": c.scenario, "role": role, "valid": p.valid,
                                        "arrivals": p.extra.get("arrivals"), **load}}
            metrics = dict(p.metrics) | {"request_throughput": p.throughput_rps, "request_goodput": p.goodput_rps,
                                         "completed": p.served}
            out += [{"benchmark": benchmark, "model": model,
                     "metric": {"name": name, "benchmark_values": [float(value)], "extra_info": {}},
                     "runners": [runner]} for name, value in metrics.items() if value is not None]
    return out


# -- CSV -------------------------------------------------------------------------------------------


CSV_COLUMNS = ("run_id", "workload", "kind", "target", "target_name", "variant", "phase", "scenario", "iteration",
               "rank", "world_size", "aa_half", "valid", "wall_ms", "decisions", "useful_tokens", "padded_tokens",
               "computed_tokens", "precision", "device", "device_type", "peak_mem_bytes", "energy_j",
               "e2el_ms", "queue_ms", "ttft_ms", "service_ms", "rate_rps", "concurrency", "source")
FORMULA_START = ("=", "+", "-", "@")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value if not isinstance(value, float) or math.isfinite(value) else ""
    text = printable(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def _csv_row(r: CallRecord) -> dict:
    serving = r.extra["serving"] if isinstance(r.extra.get("serving"), dict) else {}  # (extra: open, read as written)
    point = serving.get("point") if isinstance(serving.get("point"), dict) else {}
    ttft = (serving["first_byte_ms"] - serving["arrival_ms"] if "first_byte_ms" in serving
            and "arrival_ms" in serving else None)
    tokens = r.tokens
    row = {"run_id": r.run_id, "workload": r.workload.name, "kind": r.workload.kind,
           "target": r.target, "target_name": r.target_name, "variant": r.variant,
           "phase": r.phase, "scenario": r.scenario, "iteration": r.iteration,
           "rank": r.rank, "world_size": r.world_size, "aa_half": r.aa_half,
           "valid": r.validity.valid if r.validity is not None else True, "wall_ms": r.wall_ms,
           "decisions": r.decisions, "useful_tokens": tokens.useful if tokens else None,
           "padded_tokens": tokens.padded if tokens else None, "computed_tokens": tokens.computed if tokens else None,
           "precision": r.precision, "device": r.device.name, "device_type": r.device.type,
           "peak_mem_bytes": r.peak_mem_bytes, "energy_j": r.energy.joules if r.energy is not None else None,
           "e2el_ms": serving.get("latency_ms"), "queue_ms": serving.get("queue_ms"), "ttft_ms": ttft,
           "service_ms": serving.get("service_ms"), "rate_rps": point.get("rate_rps"),
           "concurrency": point.get("concurrency"), "source": where(r)}
    for name, entry in r.stages.items():
        row[f"stage_ms:{name}"] = stage_ms(entry)
    return row


def csv_text(records: list[CallRecord]) -> str:
    """One row a record (module docstring)."""
    rows = [_csv_row(r) for r in records]
    stages = list(dict.fromkeys(k for row in rows for k in row if k.startswith("stage_ms:")))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[_cell(c) for c in (*CSV_COLUMNS, *stages)], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({_cell(k): _cell(v) for k, v in row.items()})
    return buf.getvalue()


# -- the text of a format --------------------------------------------------------------------------


def export_text(fmt: str, records: list[CallRecord], meta: dict) -> str:
    """The run's records (and its run.json's `meta`) as format `fmt`'s text."""
    if fmt == "pytest-benchmark":
        return dumps(pytest_benchmark_json(records, meta), indent=4) + "\n"
    if fmt == "pytorch":
        return dumps(pytorch_records(records, meta), indent=2) + "\n"
    return csv_text(records)
