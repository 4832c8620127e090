"""Records made by hand for the tests, typed as the reader types a line.

A test writes the fields it is about as a dict; `typed` completes it with neutral values for the
fields every `CallRecord` has (a run id, workload `w`, target `t`, an iteration, no stages, a 1 ms
call, an empty work and model, FP32 on a CPU) and reads it as `read_records` reads a line
(`record_from_dict`: migrated, typed, bounds checked), so a test hands the analysis what a run's file would give it.
"""

from __future__ import annotations

import msgspec

from dohnuts.bench.analysis.records import CallRecord, encode_record, record_from_dict

NEUTRAL = {"run_id": "r", "workload": {"name": "w"}, "target": "t", "iteration": 0, "stages": {}, "wall_ms": 1.0,
           "work": {}, "model": {}, "precision": "fp32", "device": {"name": "cpu", "type": "cpu"}}


def typed(rec: dict) -> CallRecord:
    """`rec` (its top-level fields over `NEUTRAL`'s) as a `CallRecord`."""
    return record_from_dict(NEUTRAL | rec)


def typed_all(recs: list[dict]) -> list[CallRecord]:
    return [typed(r) for r in recs]


def written(rec: CallRecord) -> CallRecord:
    """`rec` as the file would hold it and the reader give it back: encoded by the one writer,
    decoded by the one reader's rules (every field checked against its type and bounds), and
    written again to the same line."""
    back = record_from_dict(msgspec.json.decode(encode_record(rec)))
    assert encode_record(back) == encode_record(rec)
    return back
