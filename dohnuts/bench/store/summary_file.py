"""What `report --html` and `store import` read of a run's summary.json and run.json, as typed
msgspec Structs: a hand-edited file (a count that is text, a missing workload, a trace entry that is
a list) is one line naming the file and the field (exit status 2), never a TypeError or KeyError.

The summary is written by the run's store phase and by `analyze` (dohnuts.bench.analysis.summary:
`summary`, a row per workload · target; `sections`, each section's data). The Structs hold the fields the page
reads of every row and the top-level shape of the sections; fields they do not name are kept as
they are (a newer summary reads). What a section holds inside is read by the page's own code; what
that code cannot read is one line too (`page_error`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from dohnuts.errors import DohnutsError
from dohnuts.schema import Finite, NonNegative, convert, read_file, read_json, short


class StageSummary(msgspec.Struct):
    median_ms: NonNegative
    p10_ms: NonNegative
    p90_ms: NonNegative


class SummaryRow(msgspec.Struct):
    """One workload · target of summary.json's `summary`."""

    workload: str
    target: str
    calls: int
    wall_median_ms: NonNegative
    wall_p10_ms: NonNegative
    wall_p90_ms: NonNegative
    decisions_per_s: NonNegative
    useful_tokens_per_s: NonNegative = 0.0
    spread: Finite = 0.0
    stages: dict[str, StageSummary] = {}
    energy_j_per_call: NonNegative | None = None
    harness_overhead: dict[str, Any] | None = None
    agreement: dict[str, Any] | None = None
    stream: dict[str, Any] | None = None
    peer: dict[str, Any] | None = None


class SummaryFile(msgspec.Struct):
    summary: list[SummaryRow]
    sections: dict[str, dict[str, Any]] = {}


class TraceEntry(msgspec.Struct):
    """A profiler trace run.json names (`traces`): the page links to its path (html_report.link_href)."""

    workload: str
    target: str
    path: str  # a trace file, or (a multi-process run) the folder of its ranks' traces
    calls: int
    ranks: int | None = None  # a multi-process run: the ranks, one trace each in the folder `path`


class RunFile(msgspec.Struct):
    """What the page reads of run.json."""

    run_id: str | None = None
    hwspec: str | None = None
    provenance: dict[str, Any] = {}
    traces: list[TraceEntry] = []


MAX_JSON_BYTES = 64 << 20  # a run's summary.json or run.json


def read_run_json(path: Path, kind: type) -> dict | None:
    """`path` (a summary.json: `SummaryFile`, or a run.json: `RunFile`) checked against `kind` and
    returned as it was read (a dict), None when there is no such file; one line naming the file and
    the field otherwise."""
    if not os.path.lexists(path):
        return None
    data = read_json(path, max_bytes=MAX_JSON_BYTES, error=DohnutsError, what="a run's JSON")
    if not isinstance(data, dict):
        raise DohnutsError(f"is not a JSON object (it holds a {type(data).__name__})", source=str(path))
    convert(data, kind, source=str(path), error=DohnutsError)
    return data


class RunMeasured(msgspec.Struct):
    ceilings: dict[str, Any] = {}


class RunMeta(msgspec.Struct):
    """What `analyze` and `export` read of a run.json (dohnuts.bench.commands.run writes it)."""

    hwspec: str | None = None  # a built-in name or a path (older runs: the spec's display name)
    measured: RunMeasured | None = None  # the ceilings measured at the start of the run


def read_run_meta(run_json: Path) -> dict:
    """The run.json beside a results.jsonl ({} when there is none); a corrupt one is refused."""
    if not os.path.lexists(run_json):
        return {}
    raw = read_file(run_json, max_bytes=MAX_JSON_BYTES, what="a run's JSON")
    try:
        meta = msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise DohnutsError(f"is not a run's JSON ({short(exc, 120, str)}); repair it or move it away to analyse the "
                           "results beside it", source=str(run_json)) from None
    convert(meta, RunMeta, source=str(run_json), error=DohnutsError)
    return meta


def page_error(exc: Exception, path: Path) -> DohnutsError:
    """What the page's code could not read of a summary.json that passed its Structs (a section's
    inside, hand-edited), as one line naming the file."""
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
    return DohnutsError(f"cannot be rendered ({reason}); regenerate it with `dohnuts-bench analyze`",
                        source=str(path))
