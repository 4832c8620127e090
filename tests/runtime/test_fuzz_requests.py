"""Property-based tests of the request reader (`parse_request`, `read_requests`).

Whatever a line holds — any JSON value, any bytes, deep nesting, huge numbers, NaN/Infinity
tokens, lone surrogates, a wrong type in any field — the reader returns either a valid `Request`
or a `RequestError` naming its source (file:line) on one line; never another exception. Valid
requests survive the trip through a JSONL file unchanged (ids, texts, candidates, rewards).

Bounded for CI: a few hundred examples in all, no deadline, no example database written.
"""

from __future__ import annotations

import pytest

import io
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dohnuts.errors import RequestError
from dohnuts.runtime.requests import Request, count_requests, parse_request, read_requests

# derandomize: the same examples on every run (tests/conftest.py seeds every fuzzer so; issue 46).
FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = settings(FUZZ, max_examples=40)
SRC = "fuzz.jsonl:1"

# -- strategies -----------------------------------------------------------------------------------

# Text, sometimes with the characters JSON can carry but UTF-8 cannot (lone surrogates), NUL and
# line breaks.
odd_chars = st.sampled_from(["\ud800", "\udfff", "\x00", "\n", "\r", "\u2028", "\x85", " ", "\ufeff"])
texts = st.one_of(st.text(min_size=1, max_size=20).filter(str.strip), st.text(max_size=20),
                  st.text(alphabet=st.one_of(st.characters(), odd_chars), max_size=20))
numbers = st.one_of(
    st.integers(), st.integers(min_value=-10**400, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
)
scalars = st.one_of(st.none(), numbers, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(texts, st.sampled_from(
        ["id", "text", "questions", "candidates", "answer", "rewards", "prefix", "image"])), inner, max_size=5),
), max_leaves=20)


@st.composite
def fields(draw, spec: dict) -> dict:
    """An object with the keys of `spec` = {key: (valid values, how often absent in 10)}: each key
    absent, or (1 in 10) any JSON value — a wrong type —, or of the right shape (the simplest)."""
    out = {}
    for key, (valid, absent) in spec.items():
        roll = draw(st.integers(0, 9))
        if roll >= 10 - absent:
            continue
        out[key] = draw(json_values) if roll == 9 - absent else draw(valid)
    return out


questions = st.lists(texts, min_size=1, max_size=4).flatmap(lambda cands: fields({
    "id": (st.one_of(texts, st.integers()), 5),
    "text": (texts, 1),
    "candidates": (st.just(cands), 1),
    "answer": (st.integers(-2, len(cands) + 1), 6),
    "rewards": (st.lists(numbers, min_size=len(cands), max_size=len(cands)), 6),
}))
request_like = fields({
    "id": (st.one_of(texts, st.integers()), 3),
    "prefix": (texts, 5),
    "image": (texts, 6),
    "questions": (st.lists(questions, min_size=1, max_size=3), 1),
})

# JSON tokens Python's parser accepts beyond the standard, and numbers int() refuses.
number_tokens = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "1E+2", "0.1e1"]),
    st.integers(1, 6000).map(lambda k: "9" * k),
    st.integers(1, 6000).map(lambda k: "1" + "0" * k + ".5"),
)


@st.composite
def token_lines(draw) -> str:
    """A request line with a raw number token in one of its fields."""
    tok = draw(number_tokens)
    return draw(st.sampled_from([
        '{"id": %s, "questions": [{"text": "t", "candidates": ["a", "b"]}]}',
        '{"id": "r", "questions": [{"id": %s, "text": "t", "candidates": ["a", "b"]}]}',
        '{"id": "r", "questions": [{"text": "t", "candidates": ["a", "b"], "answer": %s}]}',
        '{"id": "r", "questions": [{"text": "t", "candidates": ["a", "b"], "rewards": [%s, 0]}]}',
        '{"id": "r", "questions": [{"text": "t", "candidates": ["a", %s]}]}',
        '{"id": "r", "prefix": %s, "questions": [{"text": "t", "candidates": ["a"]}]}',
        '{"id": "r", "image": %s, "questions": [{"text": "t", "candidates": ["a"]}]}',
        '{"id": "r", "questions": %s}',
        '%s',
    ])) % tok


@st.composite
def deep_lines(draw) -> str:
    """JSON nested from a few levels to far past the parser's recursion limit, in any field."""
    depth = draw(st.integers(1, 60_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a": ', "}")]))
    nested = opener * depth + "0" + closer * depth
    where = draw(st.sampled_from(["%s", '{"id": %s, "questions": []}', '{"id": "r", "questions": [%s]}',
                                  '{"id": "r", "questions": [{"text": "t", "candidates": %s}]}',
                                  '{"id": "r", "questions": [{"text": "t", "candidates": ["a"], "rewards": %s}]}']))
    return where % nested


# -- what a result must be -------------------------------------------------------------------------

def assert_valid(req: Request) -> None:
    assert isinstance(req, Request) and isinstance(req.id, str)
    assert isinstance(req.prefix, str) and req.questions
    for s in (req.id, req.prefix, *(req.image or "",)):
        s.encode("utf-8")
    if req.image is not None:
        assert isinstance(req.image, str) and req.image and "\x00" not in req.image
    for q in req.questions:
        assert isinstance(q.id, str) and isinstance(q.text, str) and q.text.strip()
        assert isinstance(q.candidates, tuple) and q.candidates
        for s in (q.id, q.text, *q.candidates):
            assert isinstance(s, str)
            s.encode("utf-8")
        if q.rewards is not None:
            assert len(q.rewards) == len(q.candidates)
            assert all(type(r) is float and math.isfinite(r) for r in q.rewards)


def assert_error(exc: BaseException, source: str) -> None:
    assert type(exc).__name__ == "RequestError" and isinstance(exc, RequestError), repr(exc)
    assert exc.source == source
    assert str(exc).startswith(f"{source}: ") and "\n" not in str(exc) and "\r" not in str(exc)


def check_parse(obj) -> Request | None:
    try:
        req = parse_request(obj, source=SRC)
    except RequestError as exc:
        assert_error(exc, SRC)
        return None
    assert_valid(req)
    return req


def read_file(data: bytes) -> tuple[list, int, Path]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.jsonl"
        path.write_bytes(data)
        items = list(read_requests(path))
        total = count_requests(path)
    for n, item in items:
        if isinstance(item, Request):
            assert_valid(item)
        else:
            assert_error(item, f"{path}:{n}")
    return items, total, path


def editor_lines(data: bytes) -> list[int]:
    """Numbers of the lines the reader must yield: text mode's universal newlines (latin-1 maps
    every byte, and the line ends are ASCII), skipping lines that are UTF-8 and blank."""
    out = []
    for n, line in enumerate(io.TextIOWrapper(io.BytesIO(data), encoding="latin-1", newline=None), start=1):
        try:
            if not line.encode("latin-1").decode("utf-8").strip():
                continue
        except UnicodeDecodeError:
            pass
        out.append(n)
    return out


# -- properties ------------------------------------------------------------------------------------

@FUZZ
@given(json_values)
@pytest.mark.slow
def test_parse_request_any_json_value(obj):
    check_parse(obj)


@FUZZ
@given(request_like)
def test_parse_request_wrong_types_in_every_field(obj):
    check_parse(obj)


@FUZZ
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=6), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_read_requests_any_bytes(lines, end):
    data = end.join(lines)
    items, total, _ = read_file(data)
    assert [n for n, _ in items] == editor_lines(data)
    assert total == len(items)


@FUZZ
@given(st.lists(st.one_of(
    json_values.map(lambda v: json.dumps(v)),
    request_like.map(lambda v: json.dumps(v, ensure_ascii=False, allow_nan=True)),
    token_lines(),
), min_size=1, max_size=5))
@pytest.mark.slow
def test_read_requests_json_lines(lines):
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    items, total, _ = read_file(data)
    assert total == len(items) and [n for n, _ in items] == editor_lines(data)


@SMALL
@given(st.lists(deep_lines(), min_size=1, max_size=3))
def test_read_requests_deep_nesting(lines):
    items, _, _ = read_file(("\n".join(lines) + "\n").encode())
    assert len(items) == len(lines)
    for line, (_, item) in zip(lines, items):
        if line.count("[") + line.count("{") > 5_000:
            assert isinstance(item, RequestError)


@FUZZ
@given(token_lines())
def test_non_finite_and_huge_numbers(line):
    ((_, item),) = read_file(line.encode())[0]
    if isinstance(item, Request):
        for q in item.questions:
            assert q.rewards is None or all(math.isfinite(r) for r in q.rewards)


# -- valid requests round-trip ---------------------------------------------------------------------

plain = st.text(max_size=15)  # no surrogates (hypothesis leaves out category Cs by default)


@st.composite
def valid_questions(draw) -> dict:
    cands = draw(st.lists(plain, min_size=1, max_size=5))
    q = {"text": draw(plain.filter(lambda t: t.strip())), "candidates": cands}
    if draw(st.booleans()):
        q["id"] = draw(st.one_of(plain, st.integers(-10**30, 10**30)))
    grade = draw(st.sampled_from(["none", "answer", "rewards"]))
    if grade == "answer":
        q["answer"] = draw(st.integers(0, len(cands) - 1))
    elif grade == "rewards":
        q["rewards"] = draw(st.lists(st.one_of(st.integers(-10**6, 10**6), st.floats(-1e300, 1e300)),
                                     min_size=len(cands), max_size=len(cands)))
    return q


@st.composite
def valid_requests(draw) -> dict:
    r = {"questions": draw(st.lists(valid_questions(), min_size=1, max_size=4))}
    if draw(st.booleans()):
        r["id"] = draw(st.one_of(plain, st.integers(-10**30, 10**30)))
    if draw(st.booleans()):
        r["prefix"] = draw(plain)
    if draw(st.booleans()):
        path_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
        r["image"] = draw(st.text(path_chars, min_size=1, max_size=15))
    return r


@FUZZ
@given(st.lists(st.tuples(valid_requests(), st.booleans(), st.integers(0, 2)), min_size=1, max_size=5))
@pytest.mark.slow
def test_valid_requests_round_trip(entries):
    text, expect_lines, n = "", [], 0
    for obj, ascii_only, blanks in entries:
        text += "  \n" * blanks + json.dumps(obj, ensure_ascii=ascii_only) + "\n"
        n += blanks + 1
        expect_lines.append(n)
    items, total, path = read_file(text.encode("utf-8"))
    assert [k for k, _ in items] == expect_lines and total == len(entries)
    for (obj, _, _), (k, req) in zip(entries, items):
        assert isinstance(req, Request), req
        assert req.id == str(obj.get("id", f"{path}:{k}"))
        assert req.prefix == obj.get("prefix", "")
        if "image" in obj:
            img = obj["image"]
            assert req.image == (img if Path(img).is_absolute() else str(path.parent / img))
        else:
            assert req.image is None
        assert len(req.questions) == len(obj["questions"])
        for i, (qo, q) in enumerate(zip(obj["questions"], req.questions)):
            assert q.id == str(qo.get("id", f"questions[{i}]"))
            assert q.text == qo["text"] and q.candidates == tuple(qo["candidates"])
            if "answer" in qo:
                assert q.rewards == tuple(float(j == qo["answer"]) for j in range(len(q.candidates)))
            elif "rewards" in qo:
                assert q.rewards == tuple(float(x) for x in qo["rewards"])
            else:
                assert q.rewards is None
        assert parse_request(obj, source="x") == parse_request(json.loads(json.dumps(obj)), source="x")
