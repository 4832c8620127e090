"""The run store: every run's records, provenance and summary in one embedded database file.

A run writes its raw records to `results.jsonl` (the source of truth, re-analysable alone) and,
as it goes, to the store, so that questions across runs — how did text-2b's `shared` stage move
over the last 20 commits? — are one query (`dohnuts-bench history`). The store can always be
rebuilt from the JSONL files (`dohnuts-bench store import RUN_DIR ...`).

SQLite (Python's standard library), not DuckDB: it needs no package, so the store works on every
machine the harness runs on — the lent GPU machine has no network and carries every extra package
as a wheel —, several processes may write one file at once (WAL journal, a busy timeout: one
waits while another commits), and a store holds thousands of records, far below where a columnar
engine pays. The file says what it is (`PRAGMA application_id`, a `meta` table with the schema
version); anything else — another SQLite database, a corrupt or foreign file — is refused in one
line naming it.

Tables:
    runs      one row a run: id, start, git revision and dirty flag, device, driver, power limit,
              hwspec, versions and workload hashes (JSON), the whole run.json, and the machine it
              measured on (dohnuts.bench.measure.machine_id.recorded_machine)
    records   one row a record: run, order, workload, target (as reports name it), phase, wall
              time, the whole record (JSON); and, to query serving and quality across runs without
              reading the JSON: the scenario (single | stream | server | offline; NULL before
              schema 2), a load point's offered rate and a served request's latency (arrival →
              completion), an accuracy record's correct and asked questions, and the target's
              probability gap to the FP32 reference path (NULL where a record has none); and, for
              `history` (a series is one machine, device, model, precision and hwspec): the
              device's name, the model (preset or checkpoint), the precision, the A/A half, and
              the call's load (this process's share of a core, the cores other processes kept
              busy, the machine's cores: dohnuts.bench.analysis.load_verdict.record_load)
    summaries one row a run: its summary.json

Schema 2 added the serving and quality columns, schema 3 the machine and the series and load
columns; an older file is migrated when opened (the columns added, filled from the records' and
run.json's JSON; a row whose JSON cannot be read stops the migration, and nothing changes). An
existing store is checked when opened — its schema version a whole number, every table with every
column (`TABLE_COLUMNS`) — and never rebuilt in place, so a `run` never measures into a store it
cannot fill; every value read of it is typed (`SteadyCall`, JSON objects), one line naming the store
and the record otherwise. Readers (`history`, `report`) open it read-only (`read_only=True`).
Records are kept as results.jsonl holds them (dohnuts.bench.analysis.records.encode_record; rows
stored before the record's schema 2 are schema-1 records, upgraded by `migrate` as they are read,
as `CallRecord`s): the store holds what the JSONL holds.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from dohnuts.bench.analysis.load_verdict import record_load
from dohnuts.bench.analysis.records import (
    CallRecord, RecordError, encode_record, read_records, record_from_dict, target_label, workload_label,
)
from dohnuts.bench.measure.machine_id import recorded_machine
from dohnuts.bench.store.summary_file import RunFile, SummaryFile, read_run_json
from dohnuts.errors import DohnutsError
from dohnuts.schema import convert, dumps, one_line_error, short

APPLICATION_ID = 0x646F686E  # "dohn"
SCHEMA_VERSION = 3
DEFAULT_STORE = Path("runs/store.sqlite")  # beside `run`'s default folder, runs/bench
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another to commit

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started TEXT, git_revision TEXT, git_dirty INTEGER, device TEXT,
    driver TEXT, power_limit_w REAL, hwspec TEXT, versions TEXT, workloads TEXT, run_json TEXT NOT NULL,
    machine TEXT
);
CREATE TABLE IF NOT EXISTS records (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, workload TEXT NOT NULL, target TEXT NOT NULL,
    phase TEXT NOT NULL, wall_ms REAL, record TEXT NOT NULL, scenario TEXT, rate_rps REAL, latency_ms REAL,
    correct INTEGER, questions INTEGER, agreement_gap REAL, device TEXT, model TEXT, precision TEXT,
    aa_half INTEGER, own_cores REAL, others_cores REAL, cpus INTEGER, PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS records_by_group ON records (workload, target, phase);
CREATE TABLE IF NOT EXISTS summaries (run_id TEXT PRIMARY KEY, summary TEXT NOT NULL);
"""


# SQLite's primary result codes of a file that cannot be written (no permission, read-only, a disk
# I/O error, a full disk, cannot be opened): said as such, not as "not a dohnuts run store".
_CANNOT_WRITE = {sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
                 sqlite3.SQLITE_CANTOPEN}


def store_files(path: str | Path) -> list[Path]:
    """The files of a store: the database and SQLite's journal files beside it (what an output must
    never be: dohnuts.schema.output_paths)."""
    path = Path(path)
    return [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


class StoreError(DohnutsError):
    """The store file cannot be used (corrupt, foreign, newer, unwritable)."""


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """`path` opened for reading only (SQLite's `mode=ro`). A WAL store whose journal files are gone (a
    copied or committed store, or one in a folder the user may not write) cannot be opened so — SQLite
    would create its `-shm` — and is read as it stands in the file (`immutable=1`: with no `-wal`
    beside it, every committed transaction is in the file)."""
    if not path.is_file():
        raise StoreError("does not exist (a run store)", source=str(path))
    uri = path.resolve().as_uri()
    try:
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db
    except sqlite3.OperationalError:
        if os.path.lexists(f"{path}-wal"):
            raise
    return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None)


class RunStore:
    """One store file. Every method commits what it writes; several processes may share a file."""

    def __init__(self, path: str | Path = DEFAULT_STORE, *, read_only: bool = False):
        """Open (and create, migrate) the store at `path`; with `read_only` open it for reading only
        (`history`, `report`: SQLite's read-only mode, so a store the user may not write is read, and
        nothing is created or migrated)."""
        self.path, self.read_only = Path(path), read_only
        where = str(self.path)
        try:
            if self.path.exists() and not self.path.is_file():
                raise StoreError("is not a file (a run store)", source=where)
            if read_only:
                self.db = _connect_read_only(self.path)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot be opened ({exc})", source=where) from None
        try:
            self._prepare()
        except BaseException as exc:
            self.db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _CANNOT_WRITE:  # a full disk is not a foreign file
                    raise StoreError(f"cannot be written ({exc})", source=where) from None
                raise StoreError(f"is not a dohnuts run store ({exc})", source=where) from None
            raise

    def _prepare(self) -> None:
        app = self.db.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if app not in (0, APPLICATION_ID) or (app == 0 and tables):
            raise StoreError("is an SQLite database of something else, not a dohnuts run store",
                             source=str(self.path))
        if app == 0 and self.read_only:
            raise StoreError("is an empty SQLite file, not a run store yet", source=str(self.path))
        if app == 0:  # a new store: its tables made (an existing one is checked, never rebuilt in place)
            self.db.execute("PRAGMA journal_mode = WAL")
            with self._transaction():
                for statement in filter(str.strip, _TABLES.split(";")):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                # (OR IGNORE: another process may have made the same new store meanwhile)
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        if not self.read_only:
            self.db.execute("PRAGMA synchronous = NORMAL")
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(f"has schema version {version}, newer than this dohnuts reads ({SCHEMA_VERSION})",
                             source=str(self.path))
        if version < SCHEMA_VERSION:
            if self.read_only:
                raise StoreError(f"has schema version {version}, older than this dohnuts reads ({SCHEMA_VERSION}); "
                                 "a command that writes the store (e.g. `dohnuts-bench store import`) migrates it",
                                 source=str(self.path))
            self._migrate(version)
        self._check_columns()

    def _version(self) -> int:
        """The schema version the meta table holds: a whole number, or one line saying what it is."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        text = None if row is None else row[0]
        try:
            version = int(text) if isinstance(text, (str, int)) and not isinstance(text, bool) else None
        except ValueError:
            version = None
        if version is None or version < 1:
            raise StoreError(f"has a schema version of {short(text, 40)}, not a whole number ≥ 1: the store is "
                             "damaged; rebuild it (`dohnuts-bench store import RUN_DIR ...` into a new file)",
                             source=str(self.path))
        return version

    def _check_columns(self) -> None:
        """Every table with every column this dohnuts reads and writes (a renamed or dropped column
        is refused here, when the store is opened: a `run` never measures into a store it cannot fill)."""
        for table, columns in TABLE_COLUMNS.items():
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in columns if c not in have]
            if missing:
                what = f"no table {table}" if not have else f"table {table} lacks column(s) {', '.join(missing)}"
                raise StoreError(f"is not a dohnuts run store of schema {SCHEMA_VERSION} ({what}): rebuild it "
                                 "(`dohnuts-bench store import RUN_DIR ...` into a new file)", source=str(self.path))

    def _migrate(self, version: int) -> None:
        """An older schema → this one, in one transaction: schema 1 → 2 the serving and quality
        columns, 2 → 3 the machine (runs) and the series and load columns (records), each filled
        from the JSON the rows hold. A row whose JSON cannot be read stops it, and nothing changes."""
        self.db.execute("PRAGMA journal_mode = WAL")  # as a new store has it: several writers at once
        with self._transaction():
            added = []
            for table, columns in (("records", SERVING_COLUMNS + SERIES_COLUMNS), ("runs", RUN_COLUMNS)):
                have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                for column, kind in columns:
                    if column not in have:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            fill = (SERVING_COLUMNS if version < 2 else ()) + SERIES_COLUMNS
            sets = ", ".join(f"{c} = ?" for c, _ in fill)
            rows = self.db.execute("SELECT run_id, seq, record FROM records").fetchall()
            for run_id, seq, text in rows:
                rec = self._record(text, f"record {seq} of run {run_id}", "migrated")
                values = (serving_columns(rec) if version < 2 else ()) + series_columns(rec)
                added.append((*values, run_id, seq))
            self.db.executemany(f"UPDATE records SET {sets} WHERE run_id = ? AND seq = ?", added)
            for run_id, text in self.db.execute("SELECT run_id, run_json FROM runs").fetchall():
                meta = self._json_object(text, f"the run.json of run {run_id}", "migrated")
                self.db.execute("UPDATE runs SET machine = ? WHERE run_id = ?",
                                (recorded_machine(meta if isinstance(meta, dict) else {}), run_id))
            self.db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _json_object(self, text, what: str, doing: str = "read") -> dict:
        """A JSON object the store holds (a record, a run.json, a summary), or one line naming it:
        nothing is changed (a migration is rolled back)."""
        try:
            value = msgspec.json.decode(text) if isinstance(text, (str, bytes)) else None
        except (msgspec.DecodeError, RecursionError):
            value = None
        if not isinstance(value, dict):
            raise StoreError(f"holds {what}, which is not a JSON object: the store cannot be {doing}; rebuild it "
                             "(`dohnuts-bench store import RUN_DIR ...` into a new file)", source=str(self.path))
        return value

    def _record(self, text, what: str, doing: str = "read") -> CallRecord:
        """A record the store holds (written by any schema `migrate` reads), or one line naming it."""
        try:
            return record_from_dict(self._json_object(text, what, doing))
        except RecordError as exc:  # the store's file, the record and its field
            raise one_line_error(StoreError(exc.message, source=str(self.path),
                                            field=f"{what}: {exc.field}" if exc.field else what)) from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")  # the write lock now: a concurrent writer waits here
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def add_run(self, run_id: str, meta: dict) -> None:
        """Insert or update a run from its run.json content (provenance, hwspec, workloads)."""
        prov = meta.get("provenance") or {}
        revision, dirty = _git(prov.get("git"))
        device = prov.get("device") or {}
        row = (run_id, prov.get("time") or _started(run_id), revision, dirty,
               device.get("name"), device.get("driver"), _number(device.get("power_limit_w")), meta.get("hwspec"),
               dumps(prov.get("packages") or prov.get("versions") or {}),
               dumps([{"name": w.get("name"), "file_hash": w.get("file_hash")} for w in meta.get("workloads") or []
                      if isinstance(w, dict)]),
               dumps(meta), recorded_machine(meta))
        with self._transaction():
            self.db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(RUN_FIELDS)}) "
                            f"VALUES ({', '.join('?' * len(RUN_FIELDS))})", row)

    def add_records(self, run_id: str, records: Iterable[CallRecord], *, start: int | None = None) -> int:
        """Append records of a run (numbered after those it holds); returns how many."""
        with self._transaction():
            seq = start if start is not None else self.db.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM records WHERE run_id = ?", (run_id,)).fetchone()[0]
            rows = [(run_id, seq + n, workload_label(rec), target_label(rec), rec.phase, rec.wall_ms,
                     encode_record(rec), *serving_columns(rec), *series_columns(rec))
                    for n, rec in enumerate(records)]
            self.db.executemany(f"INSERT OR REPLACE INTO records ({', '.join(RECORD_FIELDS)}) "
                                f"VALUES ({', '.join('?' * len(RECORD_FIELDS))})", rows)
        return len(rows)

    def add_summary(self, run_id: str, summary: dict) -> None:
        with self._transaction():
            self.db.execute("INSERT OR REPLACE INTO summaries VALUES (?, ?)", (run_id, dumps(summary)))

    def delete_run(self, run_id: str) -> None:
        """Forget a run (one refused before it recorded anything)."""
        with self._transaction():
            for table in ("records", "summaries", "runs"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

    def import_run(self, run_dir: str | Path) -> tuple[str, int]:
        """A finished run directory (results.jsonl or results.jsonl.gz, run.json, summary.json when
        there is one) into the store, replacing what the store held of that run. Returns (run id,
        records)."""
        run_dir = Path(run_dir)
        results = next((run_dir / n for n in ("results.jsonl", "results.jsonl.gz") if (run_dir / n).is_file()), None)
        if results is None:
            raise DohnutsError("holds no results.jsonl or results.jsonl.gz", source=str(run_dir))
        records = read_records(results)
        meta = read_run_json(run_dir / "run.json", RunFile) or {}  # typed: a hand-edited file is one line
        run_id = str(meta.get("run_id") or (records[0].run_id if records else None) or run_dir.name)
        meta.setdefault("run_id", run_id)
        if not meta.get("provenance") and records:
            meta["provenance"] = records[0].provenance or {}
        self.add_run(run_id, meta)
        with self._transaction():
            self.db.execute("DELETE FROM records WHERE run_id = ?", (run_id,))
        n = self.add_records(run_id, records, start=0)
        summary = read_run_json(run_dir / "summary.json", SummaryFile)
        if summary is not None:
            self.add_summary(run_id, summary)
        return run_id, n

    # -- reading -------------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        """Every run, oldest first: id, start, revision, dirty flag, device, hwspec."""
        rows = self._query("SELECT run_id, started, git_revision, git_dirty, device, hwspec FROM runs "
                           "ORDER BY started, run_id")
        return [dict(zip(("run_id", "started", "revision", "dirty", "device", "hwspec"), r)) for r in rows]

    def records(self, run_id: str | None = None, *, workload: str | None = None, target: str | None = None,
                phase: str | None = None) -> list[CallRecord]:
        """The records, in their run's order, filtered by run, workload, target and phase."""
        sql, args = "SELECT record, run_id, seq FROM records JOIN runs USING (run_id) WHERE 1", []
        for column, value in (("run_id", run_id), ("workload", workload), ("target", target), ("phase", phase)):
            if value is not None:
                sql += f" AND records.{column} = ?"
                args.append(value)
        sql += " ORDER BY runs.started, runs.run_id, records.seq"
        return [self._record(text, f"record {seq} of run {run}") for text, run, seq in self._query(sql, args)]

    def steady_calls(self, *, workload: str | None = None, target: str | None = None, machine: str | None = None,
                     with_record: bool = False) -> list[dict[str, Any]]:
        """The steady-state calls, oldest run first, as the columns `history` reads (no record JSON
        is parsed unless `with_record`: a stage's times are in it): the run's id, start, revision,
        dirty flag, machine and hwspec, the record's workload, target, device, model, precision,
        wall time, A/A half and load."""
        names = SteadyCall.__struct_fields__
        sql = ("SELECT r.run_id, runs.started, runs.git_revision, runs.git_dirty, runs.machine, runs.hwspec, "
               "r.workload, r.target, r.device, r.model, r.precision, r.wall_ms, r.aa_half, r.own_cores, "
               "r.others_cores, r.cpus, r.seq, runs.workloads" + (", r.record" if with_record else "")
               + " FROM records r JOIN runs USING (run_id) WHERE r.phase = 'steady'")
        args: list = []
        for column, value in (("r.workload", workload), ("r.target", target), ("runs.machine", machine)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        sql += " ORDER BY runs.started, runs.run_id, r.seq"
        out, files = [], {}
        for row in self._query(sql, args):
            what = f"record {row[16]} of run {row[0]}"
            item = msgspec.structs.asdict(convert(dict(zip(names, row[:17])), SteadyCall, source=str(self.path),
                                                  error=StoreError, prefix=what))
            if row[0] not in files:  # the run's workload files, read once a run
                files[row[0]] = _workload_files(row[17])
            item["file_hash"] = files[row[0]].get(item["workload"])
            if with_record:
                item["record"] = self._record(row[-1], what)
            out.append(item)
        return out

    def _query(self, sql: str, args=()) -> list[tuple]:
        """Rows of a query; an SQLite error (a store damaged after it was opened) is one line."""
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot be read ({exc})", source=str(self.path)) from None

    def summary(self, run_id: str) -> dict | None:
        rows = self._query("SELECT summary FROM summaries WHERE run_id = ?", (run_id,))
        return None if not rows else self._json_object(rows[0][0], f"the summary of run {run_id}")

    def integrity(self) -> str:
        return self.db.execute("PRAGMA integrity_check").fetchone()[0]


SERVING_COLUMNS = (("scenario", "TEXT"), ("rate_rps", "REAL"), ("latency_ms", "REAL"), ("correct", "INTEGER"),
                   ("questions", "INTEGER"), ("agreement_gap", "REAL"))
SERIES_COLUMNS = (("device", "TEXT"), ("model", "TEXT"), ("precision", "TEXT"), ("aa_half", "INTEGER"),
                  ("own_cores", "REAL"), ("others_cores", "REAL"), ("cpus", "INTEGER"))
RUN_COLUMNS = (("machine", "TEXT"),)
RECORD_FIELDS = ("run_id", "seq", "workload", "target", "phase", "wall_ms", "record",
                 *(c for c, _ in SERVING_COLUMNS + SERIES_COLUMNS))
RUN_FIELDS = ("run_id", "started", "git_revision", "git_dirty", "device", "driver", "power_limit_w", "hwspec",
              "versions", "workloads", "run_json", *(c for c, _ in RUN_COLUMNS))
TABLE_COLUMNS = {"meta": ("key", "value"), "runs": RUN_FIELDS, "records": RECORD_FIELDS,
                 "summaries": ("run_id", "summary")}  # what `_check_columns` requires of a store
Number = float | None


def _workload_files(cell) -> dict[str, str]:
    """A run's `workloads` cell → {workload name: its file's hash}; what is not well formed is left out
    (a run stored before the column held hashes, a hand-edited cell)."""
    try:
        items = msgspec.json.decode(cell) if isinstance(cell, (str, bytes)) else []
    except msgspec.DecodeError:
        return {}
    if not isinstance(items, list):
        return {}
    return {w["name"]: w["file_hash"] for w in items
            if isinstance(w, dict) and isinstance(w.get("name"), str) and isinstance(w.get("file_hash"), str)}


class SteadyCall(msgspec.Struct, frozen=True):
    """A steady-state call as `history` reads it from the store's columns (`RunStore.steady_calls`):
    typed, so a hand-edited cell (text where a time belongs) is one line naming the record."""

    run_id: str
    started: str | None
    revision: str | None
    dirty: int | None
    machine: str | None
    hwspec: str | None
    workload: str
    target: str
    device: str | None
    model: str | None
    precision: str | None
    wall_ms: Number
    aa_half: int | None
    own_cores: Number
    others_cores: Number
    cpus: int | None
    seq: int


def serving_columns(rec: CallRecord) -> tuple:
    """A record's values of `SERVING_COLUMNS`: scenario, offered rate, latency, accuracy counts and
    the reference gap (None where the record has none). `extra` is open: its parts are read as
    far as they are the shape the harness writes."""
    serving = _part(rec.extra, "serving")
    point, accuracy = _part(serving, "point"), _part(rec.extra, "accuracy")
    return (rec.scenario, _number(point.get("rate_rps")), _number(serving.get("latency_ms")),
            _integer(accuracy.get("correct")), _integer(accuracy.get("questions")),
            rec.agreement.max_abs_gap if rec.agreement is not None else None)


def _part(d: dict, key: str) -> dict:
    return d[key] if isinstance(d.get(key), dict) else {}


def series_columns(rec: CallRecord) -> tuple:
    """A record's values of `SERIES_COLUMNS`: its device's name, model (the preset or checkpoint it
    names, else its config's name), precision, A/A half and load (None where it has none)."""
    model = rec.model_source
    if model is None:
        model = rec.model.get("name") if isinstance(rec.model.get("name"), str) else None
    return (rec.device.name, model, rec.precision, rec.aa_half, *record_load(rec))


def _integer(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _started(run_id: str) -> str | None:
    """A run id's start time (`YYYYmmdd-HHMMSS-label`) as ISO text, when it has one."""
    head = run_id[:15]
    if len(head) == 15 and head[8] == "-" and (head[:8] + head[9:]).isdigit():
        return f"{head[:4]}-{head[4:6]}-{head[6:8]}T{head[9:11]}:{head[11:13]}:{head[13:15]}"
    return None


def _git(value) -> tuple[str | None, int | None]:
    """(revision, dirty flag) of a provenance's `git`: "abc123+dirty", or a mapping."""
    if isinstance(value, dict):
        dirty = value.get("dirty")
        return value.get("revision"), None if dirty is None else int(bool(dirty))
    if isinstance(value, str) and value and value != "unknown":
        return value.removesuffix("+dirty"), int(value.endswith("+dirty"))
    return None, None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class StoreMirror:
    """A run's records into the store as they are written (a `RecordSink` mirror). The JSONL stays
    the source of truth: if the store cannot take a record (held too long by another writer, the
    disk), the run goes on, one line says so, and `dohnuts-bench store import RUN_DIR` repairs it."""

    def __init__(self, store: RunStore, run_id: str, warn=print):
        self.store, self.run_id, self.warn = store, run_id, warn
        self.failed = False

    def write(self, record: CallRecord) -> None:
        if self.failed:
            return
        try:
            self.store.add_records(self.run_id, [record])
        except (sqlite3.Error, OSError) as exc:
            self.failed = True
            self.warn(f"the run store {self.store.path} took no more records ({exc}); results.jsonl holds them "
                      f"all (dohnuts-bench store import puts them in later)")


def import_dirs(store: RunStore, dirs: list[Path], log=lambda msg: None) -> int:
    """Import each run directory of `dirs` into `store`; one that cannot be read is skipped and said
    (`log`). Returns how many were imported."""
    n = 0
    for d in dirs:
        try:
            run_id, records = store.import_run(d)
        except DohnutsError as exc:
            log(f"skipped {d}: {exc}")
            continue
        log(f"imported {d} as {run_id} ({records} records)")
        n += 1
    return n
