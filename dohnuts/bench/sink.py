"""Where a run's records go: the public record sink the runner and the launcher plugins write to.

A record is a `CallRecord` (schema: dohnuts.bench.analysis.records) written as one strict-JSON
line (`encode_record`: a non-finite number becomes null, never a bare NaN) at once, so a run
killed at any moment (Ctrl-C, a dead rank) leaves a file holding every completed record. A sink
opened on a path (`RecordSink.open`) writes each line whole or not at all (dohnuts.schema.JsonlFile):
a full disk leaves the file valid up to its last complete record, and the run ends with one line
saying so. `copy_records` moves a rank's own results file into the run's sink (a launcher's job).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from dohnuts.bench.analysis.records import CallRecord, encode_record, read_records
from dohnuts.schema import JsonlFile

__all__ = ["CallRecord", "RecordSink"]


class RecordSink:
    """Appends records to a results file (a run's results.jsonl, or a rank's own JSONL): a
    `JsonlFile` (whole lines), or an open text file (each line written in one call and flushed);
    hands each record, once written, to its mirrors (the run store: dohnuts.bench.store.run_store)."""

    def __init__(self, file: TextIO | JsonlFile, mirrors: tuple = ()):
        self.file = file
        self.mirrors = mirrors  # objects with write(record): told of every record after the file
        self.written = 0  # records written through this sink

    @classmethod
    @contextmanager
    def open(cls, path: str | Path, mirrors: tuple = ()) -> Iterator[RecordSink]:
        """A sink appending whole records to `path` (created if need be), closed on exit."""
        with JsonlFile(path) as f:
            yield cls(f, mirrors)

    def write(self, record: CallRecord) -> None:
        """Append one record as one strict-JSON line (whole, or not at all on a JsonlFile)."""
        line = encode_record(record)
        if isinstance(self.file, JsonlFile):
            self.file.write_line(line)
        else:
            self.file.write(line + "\n")
            self.file.flush()
        self.written += 1
        for m in self.mirrors:
            m.write(record)

    def copy_records(self, path: str | Path) -> int:
        """Write every record of the results file `path` (a rank's own JSONL) here; a last line
        cut by a rank killed mid-write is skipped with a warning. Returns how many."""
        records = read_records(path)
        for record in records:
            self.write(record)
        return len(records)
