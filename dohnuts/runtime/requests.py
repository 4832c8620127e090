"""Requests in the public predict format, validated into frozen dataclasses.

    {"id": "r1", "image": "path.png",              # image optional
     "prefix": "shared context text",               # optional, may be empty
     "questions": [{"id": "q1", "text": "Which ...?",
                    "candidates": ["red", "green", "blue"],
                    "answer": 1}]}                  # training only: index, or "rewards": [0, 1, 0]

A request is one batched model invocation. Every problem raises `RequestError` naming the
source (file:line) and the field, e.g. `requests.jsonl:7: field 'questions[0].candidates': is empty`.
"""

from __future__ import annotations

import json
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


def _str(obj: dict, key: str, source: str, where: str, *, required: bool = True, default: str = "") -> str:
    value = obj.get(key, None)
    if value is None:
        if required:
            raise RequestError("is missing", source=source, field=f"{where}{key}")
        return default
    if not isinstance(value, str):
        raise RequestError(f"must be a string, got {type(value).__name__}", source=source, field=f"{where}{key}")
    return value


def parse_question(obj: Any, source: str, where: str) -> Question:
    if not isinstance(obj, dict):
        raise RequestError("must be an object", source=source, field=where.rstrip("."))
    qid = obj.get("id", where.rstrip("."))
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
    rewards = None
    if "rewards" in obj and obj["rewards"] is not None:
        r = obj["rewards"]
        if not isinstance(r, list) or len(r) != len(cands) or not all(isinstance(x, (int, float)) for x in r):
            raise RequestError(f"must be a list of {len(cands)} numbers", source=source, field=f"{where}rewards")
        rewards = tuple(float(x) for x in r)
    elif "answer" in obj and obj["answer"] is not None:
        a = obj["answer"]
        if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < len(cands):
            raise RequestError(f"must be a candidate index in [0, {len(cands)})", source=source,
                               field=f"{where}answer")
        rewards = tuple(1.0 if i == a else 0.0 for i in range(len(cands)))
    return Question(id=str(qid), text=text, candidates=tuple(cands), rewards=rewards)


def parse_request(obj: Any, *, source: str, base_dir: Path | None = None) -> Request:
    if not isinstance(obj, dict):
        raise RequestError("a request must be a JSON object", source=source)
    rid = str(obj.get("id", source))
    qs = obj.get("questions")
    if not isinstance(qs, list) or not qs:
        raise RequestError("must be a non-empty list", source=source, field="questions")
    questions = tuple(parse_question(q, source, f"questions[{i}].") for i, q in enumerate(qs))
    prefix = _str(obj, "prefix", source, "", required=False)
    image = obj.get("image")
    if image is not None:
        if not isinstance(image, str) or not image:
            raise RequestError("must be a file path", source=source, field="image")
        if base_dir is not None and not Path(image).is_absolute():
            image = str(base_dir / image)
    return Request(id=rid, questions=questions, prefix=prefix, image=image)


def read_requests(path: str | Path) -> Iterator[tuple[int, Request | RequestError]]:
    """(line number, request or the error that line raised) for each non-blank line of a JSONL file."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            source = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield n, RequestError(f"malformed JSON ({exc.msg} at column {exc.colno})", source=source)
                continue
            try:
                yield n, parse_request(obj, source=source, base_dir=path.parent)
            except RequestError as exc:
                yield n, exc
