"""Requests in the public predict format, validated into frozen dataclasses.

    {"id": "r1", "image": "path.png",              # image optional
     "prefix": "shared context text",               # optional, may be empty
     "questions": [{"id": "q1", "text": "Which ...?",
                    "candidates": ["red", "green", "blue"],
                    "answer": 1}]}                  # training only: index, or "rewards": [0, 1, 0]

A request is one batched model invocation. The line format is declared once, by `RequestLine`
and `QuestionLine` (msgspec Structs; other keys are ignored); a line becomes a `Request` of
`Question`s. Every problem raises `RequestError` naming the source (file:line) and the field,
e.g. `requests.jsonl:7: field 'questions[0].candidates': is empty`. Nothing else escapes the
reader: a line that is not UTF-8, JSON nested too deeply for the parser, a number with too many
digits, a lone surrogate in a string, a non-finite or boolean reward or answer are all
`RequestError`s of that line only.

Reading is msgspec's typed decoder straight into `RequestLine` (fast: no intermediate objects, no
hand-written checks on the way); a line it refuses is parsed again by Python's json module, which
reads NaN, Infinity and lone surrogates and so says exactly what is wrong with the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from dohnuts.errors import RequestError
from dohnuts.limits import MAX_CANDIDATES_PER_QUESTION, MAX_QUESTIONS_PER_REQUEST
from dohnuts.schema import Invalid, convert, open_file, short, size_words, why_not_finite


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


TRAINING_LABELS = "training data needs 'answer' or 'rewards' on every question"


def require_rewards(request: Request, source: str | None = None) -> None:
    """Refuse a request with a question that has no rewards (neither `answer` nor `rewards`):
    the one check that training data is labelled (training, its data loading and collation)."""
    for i, q in enumerate(request.questions):
        if q.rewards is None:
            raise RequestError(TRAINING_LABELS, source=source or f"request {request.id!r}", field=f"questions[{i}]")


class QuestionLine(msgspec.Struct, frozen=True):
    text: str
    candidates: Annotated[list[str], Meta(min_length=1, max_length=MAX_CANDIDATES_PER_QUESTION)]
    id: str | int | None = None  # default: the question's path, questions[i]
    rewards: list[float] | None = None  # graded rewards, one per candidate (wins over `answer`)
    answer: int | None = None  # the index of the right candidate

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise Invalid("is empty", field="text")
        n = len(self.candidates)
        if self.rewards is not None:
            if len(self.rewards) != n:
                raise Invalid(f"must be a list of {n} numbers, got {len(self.rewards)}", field="rewards")
            for i, x in enumerate(self.rewards):
                if why_not_finite(x):
                    raise Invalid(f"must be a finite number, got {why_not_finite(x)}", field=f"rewards[{i}]")
        elif self.answer is not None and not 0 <= self.answer < n:
            got = f"{self.answer!r}" if abs(self.answer) < 10**15 else "a very large number"
            raise Invalid(f"must be a candidate index in [0, {n}), got {got}", field="answer")

    def rewards_tuple(self) -> tuple[float, ...] | None:
        if self.rewards is not None:
            return tuple(float(x) for x in self.rewards)
        if self.answer is not None:
            return tuple(1.0 if i == self.answer else 0.0 for i in range(len(self.candidates)))
        return None


class RequestLine(msgspec.Struct, frozen=True):
    # bounded (dohnuts.limits): a request is one batched pass, so 60,000 questions in a line once asked
    # a pass for more memory than the machine had and ended the run; now that line alone is refused
    questions: Annotated[list[QuestionLine], Meta(min_length=1, max_length=MAX_QUESTIONS_PER_REQUEST)]
    id: str | int | None = None  # default: the line's source, file:line
    prefix: str | None = None
    image: str | None = None

    def __post_init__(self) -> None:
        if self.image is not None and (not self.image or "\0" in self.image):
            raise Invalid("must be a file path", field="image")


_DECODER = msgspec.json.Decoder(RequestLine)


def _unicode(line: RequestLine, source: str) -> None:
    """Refuse a lone surrogate in any string of the line (JSON's \\ud800 escapes can make them;
    only Python's parser lets them through)."""
    strings = [("id", line.id), ("prefix", line.prefix), ("image", line.image)]
    for i, q in enumerate(line.questions):
        strings += [(f"questions[{i}].id", q.id), (f"questions[{i}].text", q.text)]
        strings += [(f"questions[{i}].candidates[{j}]", c) for j, c in enumerate(q.candidates)]
    for field, value in strings:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(f"is not valid Unicode (lone surrogate U+{ord(value[exc.start]):04X} at character "
                                   f"{exc.start})", source=source, field=field) from None


def _request(line: RequestLine, source: str, base_dir: Path | None) -> Request:
    image = line.image
    if image is not None and base_dir is not None and not Path(image).is_absolute():
        image = str(base_dir / image)
    questions = tuple(Question(id=f"questions[{i}]" if q.id is None else str(q.id), text=q.text,
                               candidates=tuple(q.candidates), rewards=q.rewards_tuple())
                      for i, q in enumerate(line.questions))
    return Request(id=source if line.id is None else str(line.id), questions=questions, prefix=line.prefix or "",
                   image=image)


def parse_request(obj: Any, *, source: str, base_dir: Path | None = None) -> Request:
    """A parsed JSON value (`json.loads` of a line) as a Request; RequestError otherwise."""
    if not isinstance(obj, dict):
        raise RequestError(f"a request must be a JSON object, got {short(type(obj).__name__)}", source=source)
    line = convert(obj, RequestLine, source=source, error=RequestError)
    _unicode(line, source)
    return _request(line, source, base_dir)


def parse_line(text: str, *, source: str, base_dir: Path | None = None) -> Request:
    """One line of a request file as a Request; RequestError naming `source` otherwise."""
    try:
        return _request(_DECODER.decode(text), source, base_dir)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass  # the line again, by the parser that says what is wrong with it
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON ({exc.msg} at column {exc.colno})", source=source) from None
    except RecursionError:
        raise RequestError("malformed JSON (nested too deeply to parse)", source=source) from None
    except ValueError as exc:  # an integer with more digits than int() converts (sys.set_int_max_str_digits)
        why = "an integer has too many digits" if "digits" in str(exc) else (str(exc).splitlines() or ["?"])[0]
        raise RequestError(f"malformed JSON ({why})", source=source) from None
    return parse_request(obj, source=source, base_dir=base_dir)


MAX_LINE_BYTES = 64 * 1024 * 1024  # one request line; a longer one (a stream without newlines) is refused unread


def _lines(f) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes without the line end) of a binary file, split as text mode's universal
    newlines split it (\\n, \\r\\n, and a lone \\r end a line), so the numbers are an editor's. A line
    over MAX_LINE_BYTES is skipped to its end in bounded pieces and given as None."""
    n = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            n += 1 + raw.count(b"\r")
            while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                n += rest.count(b"\r")
            n += rest.count(b"\r")
            yield n, None
            continue
        if raw.endswith(b"\r\n"):
            raw = raw[:-2]
        elif raw.endswith(b"\n"):
            raw = raw[:-1]
        for part in raw.split(b"\r"):
            n += 1
            yield n, part


def _open(path: Path):
    """The request file: a regular file, or a pipe (read once, as a stream); a device, a socket, a
    directory or a name too long is refused by its stat before it is opened."""
    return open_file(path, error=RequestError, what="a JSONL file", streams=True)


def _text_lines(path: Path) -> Iterator[tuple[int, str | RequestError]]:
    """(line number, text or why it is not UTF-8) for each line that is not blank."""
    with _open(path) as f:
        for n, raw in _lines(f):
            if raw is None:
                yield n, RequestError(f"is longer than {size_words(MAX_LINE_BYTES)} (not read)",
                                      source=f"{path}:{n}")
                continue
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
        try:
            yield n, parse_line(line, source=f"{path}:{n}", base_dir=path.parent)
        except RequestError as exc:
            yield n, exc
