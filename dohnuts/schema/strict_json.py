"""The one strict-JSON writer of the project: never a bare NaN or Infinity (a non-finite number is
written as null), atomic files (a temporary file renamed over the old one: `write_text_atomic`,
`write_bytes_atomic`; a symbolic link in the place of the file is replaced, never followed)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from dohnuts.errors import DohnutsError
from dohnuts.schema.values import one_line_error


def json_safe(obj: Any, nonfinite: list[str] | None = None, at: str = "") -> Any:
    """`obj` with every non-finite float (NaN, ±inf) replaced by None (its path appended to
    `nonfinite` when given), tuples as lists: what strict JSON can hold."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if nonfinite is not None:
            nonfinite.append(at)
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v, nonfinite, f"{at}.{k}" if at else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, nonfinite, f"{at}.{i}") for i, v in enumerate(obj)]
    return obj


def dumps(obj: Any, *, compact: bool = False, list_nonfinite: bool = False, **kw) -> str:
    """Strict JSON (never a bare NaN or Infinity; `json.dumps` keywords otherwise): a non-finite
    number is written as null, and with `list_nonfinite` its path is listed under the object's
    `nonfinite` key (the training log names what went wrong). `compact`: one line without spaces,
    formatted by orjson (prediction results: serialising is on a single call's critical path, and
    orjson formats floats several times faster than json: docs/history/evolution.md M20)."""
    if compact and not list_nonfinite and not kw:
        try:
            return orjson.dumps(obj).decode()  # a non-finite float is written as null
        except (TypeError, orjson.JSONEncodeError):  # e.g. an integer beyond 64 bits
            kw = {"separators": (",", ":")}
    if not list_nonfinite:
        try:
            return json.dumps(obj, allow_nan=False, **kw)
        except ValueError:
            return json.dumps(json_safe(obj), allow_nan=False, **kw)
    bad: list[str] = []
    clean = json_safe(obj, bad)
    if bad:
        clean["nonfinite"] = bad
    return json.dumps(clean, allow_nan=False, **kw)


def write_json(path: str | Path, obj: Any, *, error: type[DohnutsError] = DohnutsError, **kw) -> None:
    """Write `obj` as strict JSON (`dumps`) atomically (`write_text_atomic`)."""
    write_text_atomic(path, dumps(obj, **kw), error=error)


def write_text_atomic(path: str | Path, text: str, *, error: type[DohnutsError] = DohnutsError) -> None:
    """Write `text` atomically (`write_bytes_atomic`, UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"), error=error)


def write_bytes_atomic(path: str | Path, data: bytes, *, error: type[DohnutsError] = DohnutsError) -> None:
    """Write `data` atomically: a new temporary file beside `path` (created exclusively, so no link
    planted under its name is followed), then a rename, so an interrupted write (or a full disk)
    leaves the previous file (or none), never half of one — and a symbolic link at `path` is
    replaced, never written through. A write that fails is one `error` line naming the file."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:80]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise one_line_error(error(f"cannot be written ({exc.strerror or exc}); nothing was written",
                                   source=str(path))) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
