"""User-facing errors: each names the file (or request) and the field that is wrong.

Every error a user can cause by bad input derives from `DohnutsError`; the CLIs print its
message on one line and exit with status 2, never with a traceback.
"""

from __future__ import annotations


class DohnutsError(Exception):
    """Bad input from the user: a file, a field or a request that cannot be used."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.field = field
        where = ""
        if source is not None:
            where = f"{source}"
            if field is not None:
                where += f": field '{field}'"
            where += ": "
        elif field is not None:
            where = f"field '{field}': "
        super().__init__(f"{where}{message}")


class ConfigError(DohnutsError):
    """An invalid model, workload or hardware configuration."""


class CheckpointError(DohnutsError):
    """A checkpoint directory or adapter file that cannot be loaded as it is."""


class RequestError(DohnutsError):
    """A prediction request (or one of its questions) that cannot be scored."""


class ImageError(RequestError):
    """An image that cannot be decoded under the preprocessing policy."""
