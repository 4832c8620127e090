"""Requests in the public predict format, validated into frozen dataclasses.

    {"id": "r1", "image": "path.png",              # image optional
     "prefix": "shared context text",               # optional, may be empty
     "questions": [{"id": "q1", "text": "Which ...?",
                    "candidates": ["red", "green", "blue"],
                    "answer": 1}]}                  # training only: index, or "rewards": [0, 1, 0]

A request is one batched model invocation. Every problem raises `RequestError` naming the
source (file:line) and the field, e.g. `requests.jsonl:7: field 'questions[0].candidates': is empty`.
Nothing else escapes the reader: a line that is not UTF-8, JSON nested too deeply for the parser,
a number with too many digits, a lone surrogate in a string, a non-finite or boolean reward or
answer are all `RequestError`s of that line only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dohnuts.errors import RequestError


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    candidates: tuple[str, ...]
    rewards: tuple[float, ...] | None = None  # training / evaluation only


@dataclass(frozen=True)
class Request:
    id: str
    questions: tuple[Question, ...]
    prefix: str = ""
    image: str | None = None  # a path (relative paths resolve against the request file's folder)

    @property
    def decisions(self) -> int:
        return len(self.questions)


def _unicode(value: str, source: str, field: str) -> str:
    """`value` if it can be encoded as UTF-8 (JSON's \\ud800 escapes can make lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"is not valid Unicode (lone surrogate U+{ord(value[exc.start]):04X} at character "
                           f"{exc.start})", source=source, field=field) from None
    return value


def _str(obj: dict, key: str, source: str, where: str, *, required: bool = True, default: str = "") -> str:
    value = obj.get(key, None)
    if value is None:
        if required:
            raise RequestError("is missing", source=source, field=f"{where}{key}")
        return default
    if not isinstance(value, str):
        raise RequestError(f"must be a string, got {type(value).__name__}", source=source, field=f"{where}{key}")
    return _unicode(value, source, f"{where}{key}")


def _id(obj: dict, source: str, field: str, default: str) -> str:
    """An id: a string, or an integer (written as its decimal string); `default` when absent."""
    value = obj.get("id")
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise RequestError(f"must be a string or an integer, got {type(value).__name__}", source=source, field=field)
    return _unicode(value, source, field)


def _not_finite(x: Any) -> str | None:
    """Why `x` is not a finite number (None when it is one). Booleans are not numbers here."""
    if isinstance(x, bool):
        return "a boolean"
    if not isinstance(x, (int, float)):
        return f"a {type(x).__name__}"
    try:
        f = float(x)
    except OverflowError:
        return "too large for a float"
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "infinite"
    return None


def parse_question(obj: Any, source: str, where: str) -> Question:
    if not isinstance(obj, dict):
        raise RequestError("must be an object", source=source, field=where.rstrip("."))
    qid = _id(obj, source, f"{where}id", where.rstrip("."))
    text = _str(obj, "text", source, where)
    if not text.strip():
        raise RequestError("is empty", source=source, field=f"{where}text")
    cands = obj.get("candidates")
    if not isinstance(cands, list):
        raise RequestError("must be a list of strings", source=source, field=f"{where}candidates")
    if not cands:
        raise RequestError("is empty: a question needs at least one candidate", source=source,
                           field=f"{where}candidates")
    for i, c in enumerate(cands):
        if not isinstance(c, str):
            raise RequestError("must be a string", source=source, field=f"{where}candidates[{i}]")
        _unicode(c, source, f"{where}candidates[{i}]")
    rewards = None
    if "rewards" in obj and obj["rewards"] is not None:
        r = obj["rewards"]
        if not isinstance(r, list) or len(r) != len(cands):
            raise RequestError(f"must be a list of {len(cands)} numbers", source=source, field=f"{where}rewards")
        for i, x in enumerate(r):
            why = _not_finite(x)
            if why is not None:
                raise RequestError(f"must be a list of {len(cands)} finite numbers; element {i} is {why}",
                                   source=source, field=f"{where}rewards")
        rewards = tuple(float(x) for x in r)
    elif "answer" in obj and obj["answer"] is not None:
        a = obj["answer"]
        if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < len(cands):
            got = _not_finite(a)
            if got is None:
                got = (f"{a!r}" if abs(a) < 10**15 else "a very large number") + \
                    ("" if isinstance(a, int) else ", not an integer")
            raise RequestError(f"must be a candidate index in [0, {len(cands)}), got {got}", source=source,
                               field=f"{where}answer")
        rewards = tuple(1.0 if i == a else 0.0 for i in range(len(cands)))
    return Question(id=qid, text=text, candidates=tuple(cands), rewards=rewards)


def parse_request(obj: Any, *, source: str, base_dir: Path | None = None) -> Request:
    if not isinstance(obj, dict):
        raise RequestError("a request must be a JSON object", source=source)
    rid = _id(obj, source, "id", source)
    qs = obj.get("questions")
    if not isinstance(qs, list) or not qs:
        raise RequestError("must be a non-empty list", source=source, field="questions")
    questions = tuple(parse_question(q, source, f"questions[{i}].") for i, q in enumerate(qs))
    prefix = _str(obj, "prefix", source, "", required=False)
    image = obj.get("image")
    if image is not None:
        if not isinstance(image, str) or not image or "\0" in image:
            raise RequestError("must be a file path", source=source, field="image")
        _unicode(image, source, "image")
        if base_dir is not None and not Path(image).is_absolute():
            image = str(base_dir / image)
    return Request(id=rid, questions=questions, prefix=prefix, image=image)


def _lines(f) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the line end) of a binary file, split as text mode's universal
    newlines split it (\\n, \\r\\n, and a lone \\r end a line), so the numbers are an editor's."""
    n = 0
    for raw in f:
        if raw.endswith(b"\r\n"):
            raw = raw[:-2]
        elif raw.endswith(b"\n"):
            raw = raw[:-1]
        for part in raw.split(b"\r"):
            n += 1
            yield n, part


def _open(path: Path):
    try:
        return path.open("rb")
    except OSError as exc:
        why = "is a directory, not a JSONL file" if isinstance(exc, IsADirectoryError) else \
            f"cannot be read ({exc.strerror or exc})"
        raise RequestError(why, source=str(path)) from None


def _text_lines(path: Path) -> Iterator[tuple[int, str | RequestError]]:
    """(line number, text or why it is not UTF-8) for each line that is not blank."""
    with _open(path) as f:
        for n, raw in _lines(f):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield n, RequestError(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of "
                                      "the line)", source=f"{path}:{n}")
                continue
            if text.strip():
                yield n, text


def count_requests(path: str | Path) -> int:
    """How many items `read_requests` yields for the file (its non-blank lines); RequestError when
    the file cannot be read."""
    return sum(1 for _ in _text_lines(Path(path)))


def read_requests(path: str | Path) -> Iterator[tuple[int, Request | RequestError]]:
    """(line number, request or the error that line raised) for each non-blank line of a JSONL file.

    The file is read as bytes and each line decoded on its own: one bad line (not UTF-8, nested
    too deeply, a number too long to convert, any invalid field) is an error of that line only.
    A file that cannot be opened raises RequestError naming it."""
    path = Path(path)
    for n, line in _text_lines(path):
        if isinstance(line, RequestError):
            yield n, line
            continue
        source = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, RequestError(f"malformed JSON ({exc.msg} at column {exc.colno})", source=source)
            continue
        except RecursionError:
            yield n, RequestError("malformed JSON (nested too deeply to parse)", source=source)
            continue
        except ValueError as exc:  # an integer with more digits than int() converts (sys.set_int_max_str_digits)
            why = "an integer has too many digits" if "digits" in str(exc) else (str(exc).splitlines() or ["?"])[0]
            yield n, RequestError(f"malformed JSON ({why})", source=source)
            continue
        try:
            yield n, parse_request(obj, source=source, base_dir=path.parent)
        except RequestError as exc:
            yield n, exc
