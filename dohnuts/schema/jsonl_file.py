"""JSONL files written whole record by whole record: a full disk (or any write error) leaves the file
valid up to its last complete record, never a cut line.

The file is opened with O_NOFOLLOW: a symbolic link in its place is refused (dohnuts.schema.output_paths).
Each record is one `os.write` of the complete line to an O_APPEND descriptor. A short write (the
disk filled during it) or an error cuts the file back to where the line began (`ftruncate`), then
raises the caller's one-line error naming the file and the cause. `prediction results`,
the benchmark's `results.jsonl` (dohnuts.bench.sink) and the training log are written this way.

    with JsonlFile(out, truncate=True, error=DohnutsError) as f:
        f.write_line(dumps(record))
    append_line(log_path, dumps(record), error=CheckpointError)    # one record, file opened and closed
"""

from __future__ import annotations

import os
from pathlib import Path

from dohnuts.errors import DohnutsError
from dohnuts.schema.values import one_line_error


class JsonlFile:
    """An O_APPEND descriptor that takes whole lines (`write_line`), or none of a line."""

    def __init__(self, path: str | Path, *, truncate: bool = False, error: type[DohnutsError] = DohnutsError):
        self.path, self.error = str(path), error
        flags = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | (os.O_TRUNC if truncate else 0)
                 | getattr(os, "O_NOFOLLOW", 0))  # a symbolic link planted in its place is refused, never followed
        try:
            self.fd: int | None = os.open(self.path, flags, 0o644)
        except OSError as exc:
            why = ("is a symbolic link: records are never written through one" if os.path.islink(self.path)
                   else f"cannot be written ({exc.strerror or exc})")
            raise one_line_error(error(why, source=self.path)) from None
        self.written = 0  # lines written through this object

    def write_line(self, text: str) -> None:
        """Append `text` and a newline as one record: all of it, or (after an error) none of it."""
        data = (text + "\n").encode("utf-8")
        fd = self.fd
        if fd is None:
            raise ValueError("write to a closed JsonlFile")
        start = os.fstat(fd).st_size  # where this record begins (O_APPEND: the end of the file)
        done = 0
        try:
            while done < len(data):
                n = os.write(fd, data[done:] if done else data)
                if n <= 0:
                    raise OSError(28, "No space left on device")
                done += n
        except OSError as exc:
            cut = self._cut(fd, start)
            raise one_line_error(self.error(
                f"cannot be written ({exc.strerror or exc}); the file ends at its last complete record{cut}",
                source=self.path)) from None
        self.written += 1

    @staticmethod
    def _cut(fd: int, start: int) -> str:
        try:
            os.ftruncate(fd, start)
            return ""
        except OSError as exc:  # very unusual: the part of the line that was written stays
            return f" (cutting the partial line failed too: {exc.strerror or exc})"

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __enter__(self) -> JsonlFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append_line(path: str | Path, text: str, *, error: type[DohnutsError] = DohnutsError) -> None:
    """Append one record to `path` (opened, written whole or not at all, closed)."""
    with JsonlFile(path, error=error) as f:
        f.write_line(text)
