"""The run store's schema 2 (serving and quality columns): a schema-1 file is migrated when opened
(to today's schema, 3), its columns filled from the records' JSON, and new records fill them as
they are added."""

from __future__ import annotations

import json
import sqlite3

from dohnuts.bench.store.run_store import APPLICATION_ID, SCHEMA_VERSION, RunStore
from tests.bench.typed_records import NEUTRAL, typed, typed_all

V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, started TEXT, git_revision TEXT, git_dirty INTEGER, device TEXT,
    driver TEXT, power_limit_w REAL, hwspec TEXT, versions TEXT, workloads TEXT, run_json TEXT NOT NULL
);
CREATE TABLE records (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, workload TEXT NOT NULL, target TEXT NOT NULL,
    phase TEXT NOT NULL, wall_ms REAL, record TEXT NOT NULL, PRIMARY KEY (run_id, seq)
);
CREATE TABLE summaries (run_id TEXT PRIMARY KEY, summary TEXT NOT NULL);
"""

SERVED = NEUTRAL | {
    "schema": 1, "workload": {"name": "w"}, "target": "dohnuts", "phase": "server", "scenario": "server",
    "wall_ms": 4.0, "agreement": {"max_abs_gap": 0.002, "tolerance": 0.05, "within": True},
    "extra": {"serving": {"scenario": "server", "latency_ms": 12.5, "point": {"rate_rps": 40.0}}}}
ACCURACY = NEUTRAL | {
    "schema": 1, "workload": {"name": "w"}, "target": "dohnuts", "phase": "accuracy", "scenario": "single",
    "wall_ms": 3.0, "extra": {"accuracy": {"questions": 1, "correct": 1}}}
# a record written before `scenario`: a single call's (the reader's default)
OLD = NEUTRAL | {"schema": 1, "workload": {"name": "w"}, "target": "dohnuts", "phase": "steady", "wall_ms": 5.0}

COLUMNS = "scenario, rate_rps, latency_ms, correct, questions, agreement_gap"


def test_a_schema_1_store_is_migrated_and_filled(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute("INSERT INTO runs (run_id, run_json) VALUES ('r', '{}')")
    for seq, rec in enumerate((OLD, SERVED)):
        db.execute("INSERT INTO records VALUES ('r', ?, 'w', 'dohnuts', ?, ?, ?)", (seq, rec["phase"], rec["wall_ms"],
                                                                                  json.dumps(rec)))
    db.commit()
    db.close()
    with RunStore(path) as store:
        assert store.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
        rows = store.db.execute(f"SELECT {COLUMNS} FROM records ORDER BY seq").fetchall()
        assert rows == [("single",) + (None,) * 5, ("server", 40.0, 12.5, None, None, 0.002)]
        assert store.records("r") == typed_all([OLD, SERVED])  # read as the reader reads them (migrated) ...
        stored = [json.loads(text) for (text,) in store.db.execute("SELECT record FROM records ORDER BY seq")]
        assert stored == [OLD, SERVED]  # ... and the records themselves untouched
        store.add_records("r", [typed(ACCURACY)])
        assert store.db.execute(f"SELECT {COLUMNS} FROM records WHERE seq = 2").fetchone() == (
            "single", None, None, 1, 1, None)
        assert store.integrity() == "ok"
    with RunStore(path) as again:  # opening a migrated store changes nothing
        assert again.db.execute("SELECT COUNT(*) FROM records").fetchone() == (3,)
