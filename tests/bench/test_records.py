"""The record: one typed, versioned Struct (`CallRecord`), one writer (`encode_record`), one reader
(`read_records`) and the migration of older schemas (`migrate`).

A committed schema-1 run reads through the migration to the numbers the code before schema 2
computed from it (tests/bench/fixtures/schema1-numbers.json.gz, written by `numbers` below with
`read_jsonl` at commit 1e6b6ff, the last before the typed record).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import msgspec
import pytest

from dohnuts.bench.analysis import find_hwspec
from dohnuts.bench.analysis.compare import compare_runs
from dohnuts.bench.analysis.compare_table import comparison_dict
from dohnuts.bench.analysis.records import (
    FIELDS, SCHEMA, CallRecord, RecordError, RecordWarning, encode_record, migrate, read_records, record_from_dict,
    where,
)
from dohnuts.bench.analysis.report import analyze_records
from dohnuts.bench.analysis.summary import summarize
from dohnuts.bench.sink import RecordSink
from tests.bench.typed_records import typed

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "schema1-numbers.json.gz"
RUNS = ("cpu-standard-suite", "cpu-gloo-4", "h200-ab-before", "h200-ab-after")


def _schema1(**fields) -> dict:
    """A schema-1 record as the harness wrote one before the typed record (fields it had no value
    for left out)."""
    return {"schema": 1, "run_id": "r", "workload": {"name": "w"}, "target": "dohnuts", "iteration": 0,
            "stages": {"prefix": {"host_ms": 2.0, "device_ms": None, "count": 1}}, "wall_ms": 3.0, "work": {},
            "model": {}, "precision": "fp32", "device": {"name": "cpu", "type": "cpu"}} | fields


# -- migrate ---------------------------------------------------------------------------------------


def test_migrate_upgrades_a_schema_1_record():
    old = _schema1(target_name="dohnuts", target_options={"share_prefix": False, "cuda_graphs": False},
                   my_plugin={"x": 1}, extra={"loss": 0.5}, world_size=0)
    new = migrate(old)
    assert new["schema"] == SCHEMA == 2
    assert new["variant"] == "unshared+eager"  # read from the options, as the analysis once read it
    assert new["extra"] == {"my_plugin": {"x": 1}, "loss": 0.5}  # a plugin's field moves into extra
    assert "my_plugin" not in new and "world_size" not in new  # (a world size below 1 read as 1)
    assert old["schema"] == 1 and "my_plugin" in old  # the input is not changed
    rec = record_from_dict(old)
    assert (rec.variant, rec.world_size, rec.phase, rec.aa_half) == ("unshared+eager", 1, "steady", None)


def test_migrate_reads_the_oldest_records_target_from_its_label():
    assert migrate(_schema1(target="dohnuts-eager"))["target_name"] == "dohnuts"
    assert migrate(_schema1(target="transformers"))["target_name"] is None
    assert migrate(_schema1(target="x", target_name="transformers"))["target_name"] == "transformers"
    # a variant written is kept; options make none for a target that is not dohnuts
    assert migrate(_schema1(variant="eager"))["variant"] == "eager"
    assert migrate(_schema1(target_name="peft", target_options={"share_prefix": False}))["variant"] is None


def test_migrate_leaves_a_schema_2_record_as_it_is():
    new = msgspec.to_builtins(typed({"workload": {"name": "w"}, "target": "t", "wall_ms": 1.0}))
    assert new["schema"] == 2
    assert migrate(new) is new


def test_a_record_without_schema_is_read_as_schema_1_and_a_newer_one_is_refused():
    rec = _schema1()
    del rec["schema"]
    assert record_from_dict(rec).schema == SCHEMA
    with pytest.raises(RecordError, match=r"field 'schema': has schema 3; this version reads 1, 2"):
        record_from_dict(_schema1(schema=3), "run.jsonl:4")


# -- the reader and the writer ---------------------------------------------------------------------


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_the_writer_and_the_reader_agree(tmp_path):
    recs = [typed({"workload": {"name": "w"}, "target": "t", "wall_ms": 1.5 + i, "iteration": i,
                   "stages": {"prefix": {"host_ms": 1.0, "device_ms": 0.5}}, "extra": {"loss": 0.25}})
            for i in range(3)]
    path = tmp_path / "results.jsonl"
    with RecordSink.open(path) as sink:
        for r in recs:
            sink.write(r)
    back = read_records(path)
    assert back == recs  # field by field
    assert [where(r) for r in back] == [f"{path}:{n}" for n in (1, 2, 3)]
    assert read_records(_gz(path)) == recs


def _gz(path: Path) -> Path:
    out = path.with_suffix(".jsonl.gz")
    out.write_bytes(gzip.compress(path.read_bytes()))
    return out


def test_the_writer_writes_every_field_in_order_and_no_nan():
    rec = typed({"workload": {"name": "w"}, "target": "t", "wall_ms": 2.0, "extra": {}})
    rec.extra["gap"] = math.nan
    line = encode_record(rec)
    assert "\n" not in line and "NaN" not in line
    obj = json.loads(line)
    assert list(obj) == list(CallRecord.__struct_fields__) and set(obj) == FIELDS
    assert obj["extra"]["gap"] is None and obj["aa_half"] is None and obj["schema"] == 2


def test_a_schema_1_file_reads_through_the_migration(tmp_path):
    path = _write(tmp_path / "run.jsonl", [_schema1(iteration=i, target_name="dohnuts",
                                                    target_options={"share_prefix": False}) for i in range(2)])
    recs = read_records(path)
    assert [(r.schema, r.iteration, r.variant) for r in recs] == [(2, 0, "unshared"), (2, 1, "unshared")]


def test_a_newer_schema_is_skipped_with_a_warning(tmp_path):
    path = _write(tmp_path / "run.jsonl", [_schema1(), _schema1(schema=3, iteration=1), _schema1(iteration=2)])
    with pytest.warns(RecordWarning, match=r"skipped 1 record\(s\) of schema 3 \(this version reads 1, 2; lines 2\)"):
        recs = read_records(path)
    assert [r.iteration for r in recs] == [0, 2]


def test_a_field_out_of_its_type_or_bounds_names_the_line_and_the_field(tmp_path):
    bad = _schema1(iteration=1)
    del bad["stages"]["prefix"]["host_ms"]
    with pytest.raises(RecordError, match=r"run.jsonl:2: field 'stages.prefix.host_ms': is missing"):
        read_records(_write(tmp_path / "run.jsonl", [_schema1(), bad]))
    with pytest.raises(RecordError, match=r"run.jsonl:1: field 'wall_ms'"):
        read_records(_write(tmp_path / "run.jsonl", [_schema1(wall_ms=-1.0)]))
    with pytest.raises(RecordError, match=r"run.jsonl:1: field 'aa_half'"):
        read_records(_write(tmp_path / "run.jsonl", [_schema1(aa_half=2)]))


def test_a_truncated_last_line_is_skipped_and_a_corrupt_one_named(tmp_path):
    line = json.dumps(_schema1(iteration=1))
    path = _write(tmp_path / "run.jsonl", [_schema1(), line[: len(line) // 2]])
    with pytest.warns(RecordWarning, match=r"run.jsonl:2: skipped a truncated last line"):
        assert [r.iteration for r in read_records(path)] == [0]
    path = _write(tmp_path / "run.jsonl", [line[:20], _schema1()])
    with pytest.raises(RecordError, match=r"run.jsonl: field 'line 1': line 1 is not valid JSON"):
        read_records(path)
    not_text = json.dumps(_schema1()).encode().replace(b'"w"', b'"\xff"')
    path.write_bytes(json.dumps(_schema1()).encode() + b"\n" + not_text + b"\n" + line.encode() + b"\n")
    with pytest.raises(RecordError, match=r"line 2 is not valid JSON \(not UTF-8 text"):
        read_records(path)
    _write(path, [json.dumps(_schema1()).replace("3.0", "NaN"), _schema1()])
    with pytest.raises(RecordError, match=r"line 1 holds a number that is not finite .* at wall_ms"):
        read_records(path)


# -- a committed schema-1 run: the same numbers --------------------------------------------------------


def numbers(records: list, other: list | None) -> dict:
    """What the analysis makes of a run's records: summary.json's rows, the analysis against the
    H200's spec (its groups' calls and stages), and, for an A/B pair, the comparison."""
    out = {"summary": summarize(records),
           "groups": analyze_records(records, find_hwspec("h200")).to_dict()["groups"]}
    if other is not None:
        out["compare"] = comparison_dict(compare_runs(other, records))
    return out


def _same(golden, now, path: str = "") -> list[str]:
    """Where `now` differs from `golden` (numbers to 1e-12, relative)."""
    if isinstance(golden, dict) and isinstance(now, dict):
        if set(golden) != set(now):
            return [f"{path}: keys {sorted(set(golden) ^ set(now))}"]
        return [d for k in golden for d in _same(golden[k], now[k], f"{path}.{k}")]
    if isinstance(golden, list) and isinstance(now, list) and len(golden) == len(now):
        return [d for i, (g, n) in enumerate(zip(golden, now)) for d in _same(g, n, f"{path}[{i}]")]
    if isinstance(golden, float) and isinstance(now, (int, float)):
        return [] if now == pytest.approx(golden, rel=1e-12, abs=1e-300) else [f"{path}: {golden} → {now}"]
    return [] if golden == now else [f"{path}: {str(golden)[:60]} → {str(now)[:60]}"]


@pytest.mark.parametrize("run", RUNS)
def test_a_committed_schema_1_run_gives_the_numbers_it_gave(run):
    golden = json.loads(gzip.decompress(GOLDEN.read_bytes()))[run]
    with gzip.open(FIXTURES / run / "results.jsonl.gz") as f:
        assert json.loads(f.readline())["schema"] == 1  # (the run on disk is schema 1)
    records = read_records(FIXTURES / run / "results.jsonl.gz")
    other = read_records(FIXTURES / "h200-ab-before" / "results.jsonl.gz") if run == "h200-ab-after" else None
    now = json.loads(json.dumps(numbers(records, other), default=str))
    differences = _same(golden, now)
    assert not differences, f"{len(differences)} differ:\n" + "\n".join(differences[:30])
