"""Where a run's records go: the public record sink the runner and the launcher plugins write to.

A record is one JSON object (schema: dohnuts.bench.analysis.records) written as one strict-JSON
line — a non-finite number becomes null, never a bare NaN — and flushed at once, so a run killed
at any moment (Ctrl-C, a dead rank) leaves a file holding every completed record.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from dohnuts.schema import dumps


class RecordSink:
    """Appends records to an open text file (a run's results.jsonl, or a rank's own JSONL), and
    hands each record, once written, to its mirrors (the run store: dohnuts.bench.store)."""

    def __init__(self, file: TextIO, mirrors: tuple = ()):
        self.file = file
        self.mirrors = mirrors  # objects with write(record): told of every record after the file
        self.written = 0  # records written through this sink

    @classmethod
    @contextmanager
    def open(cls, path: str | Path, mirrors: tuple = ()) -> Iterator[RecordSink]:
        """A sink appending to `path` (created if need be), closed on exit."""
        with open(path, "a", encoding="utf-8") as f:
            yield cls(f, mirrors)

    def write(self, record: dict) -> None:
        """Append one record as one strict-JSON line and flush it."""
        self.file.write(dumps(record) + "\n")
        self.file.flush()
        self.written += 1
        for m in self.mirrors:
            m.write(record)
