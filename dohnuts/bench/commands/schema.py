"""`dohnuts-bench schema [record|workload]`: the JSON Schemas of the two files users write or read,
generated from the msgspec types the project itself reads them with — so the published schema is
the reader, never a copy that drifts.

- `record`: one line of a run's results.jsonl (schema 2), as the reader decodes it and the report
  checks it (dohnuts.bench.analysis.records.ReportedRecord: `CallRecord`, every field the harness
  writes with its type and bounds — `wall_ms` in (0, 10¹⁰] ms, `precision` bf16 or fp32, ... — and
  the parts of `extra` the reports read). `extra` is the one open place (a target's or a plugin's
  fields); the reader upgrades older schemas first (`migrate`).
- `workload`: a workload YAML file (dohnuts.bench.measure.workload.WorkloadFile, the serving fields of
  dohnuts.bench.measure.serving.config), with each registered kind's `shape` (its `Shape` Struct, the
  built-in kinds' and any installed plugin's) bound to its `kind` by an if/then rule. The reader
  also takes a key left empty (`hwspec:`) as its default; the schema asks for a value.

Without an argument both are printed as one JSON object, `{"record": …, "workload": …}`, each a
whole JSON Schema (draft 2020-12, its own `$defs`). `--out FILE` writes it there instead of stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from dohnuts.bench import plugins
from dohnuts.bench.analysis.records import ReportedRecord
from dohnuts.bench.measure.workload import WorkloadFile
from dohnuts.bench.plugins import collect
from dohnuts.errors import DohnutsError
from dohnuts.schema import check_output, dumps, write_text_atomic

DIALECT = "https://json-schema.org/draft/2020-12/schema"
WHICH = ("record", "workload")


def record_schema() -> dict:
    """The schema of one results.jsonl line (`ReportedRecord`)."""
    return {"$schema": DIALECT, "title": "dohnuts-bench record (results.jsonl line)"} | msgspec.json.schema(
        ReportedRecord)


def workload_schema(kinds: dict | None = None) -> dict:
    """The schema of a workload file (`WorkloadFile`), each kind's `shape` typed by its `Shape`.
    `kinds`: name → registered kind (default: the installed plugins')."""
    if kinds is None:

        kinds = collect(plugins.plugin_manager(), "dohnuts_bench_register_workload_kinds")
    names = sorted(kinds)
    refs, defs = msgspec.json.schema_components([WorkloadFile, *(kinds[k].Shape for k in names)])
    workload_ref, shape_refs = refs[0], refs[1:]
    rules = [{"if": {"properties": {"kind": {"const": name}}, "required": ["kind"]},
              "then": {"properties": {"shape": ref}}} for name, ref in zip(names, shape_refs)]
    return {"$schema": DIALECT, "title": "dohnuts-bench workload file", "allOf": [workload_ref, *rules],
            "$defs": defs}


def schemas(which: str | None = None) -> dict:
    """One schema (`record` or `workload`), or both keyed by name."""
    if which == "record":
        return record_schema()
    if which == "workload":
        return workload_schema()
    return {"record": record_schema(), "workload": workload_schema()}


def run(args) -> int:
    if args.out:
        check_output(args.out, field="--out", what="a JSON file to write")
    text = dumps(schemas(args.which), indent=2) + "\n"
    if args.out:
        write_text_atomic(Path(args.out), text, error=DohnutsError)
        print(f"dohnuts-bench: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def setup_arguments(subparsers) -> None:
    s = subparsers.add_parser("schema", help="the JSON Schemas of a results.jsonl record and of a workload file, "
                                      "generated from the types that read them")
    s.add_argument("which", nargs="?", choices=WHICH, help="one of them (default: both, as one JSON object)")
    s.add_argument("--out", help="write the schema to this file (default: stdout)")
    s.set_defaults(func=run)
