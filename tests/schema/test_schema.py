"""dohnuts.schema: msgspec's refusals as the project's one-line errors (file, field path, problem),
the one strict-JSON writer, strict YAML, and the shared helpers."""

from __future__ import annotations

import json
import statistics
from typing import Annotated, Literal

import msgspec
import pytest
from msgspec import Meta

from dohnuts.errors import ConfigError, RequestError
from dohnuts.schema import Finite, Invalid, NonBlank, convert, decode_json, dumps, median, read_yaml, write_json


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["compute", "bandwidth"]
    value: Annotated[float, Meta(gt=0.0, description="the rate")] = 1.0
    note: NonBlank | None = None

    def __post_init__(self) -> None:
        if self.kind == "compute" and self.value > 10:
            raise Invalid("is too fast for compute", field="value")


class Doc(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    entries: dict[str, Entry] = {}
    sizes: list[Annotated[int, Meta(ge=1, le=8)]] = []
    ratio: Finite = 0.5


@pytest.mark.parametrize("data, field, message", [
    ({}, "name", "is missing"),
    ({"name": "x", "colour": 1}, "colour", "unknown field (known: name, entries, sizes, ratio)"),
    ({"name": 3}, "name", "must be a string, got 3"),
    ({"name": "x", "sizes": [1, 9]}, "sizes[1]", "must be <= 8, got 9"),
    ({"name": "x", "sizes": [True]}, "sizes[0]", "must be an integer, got a boolean (true)"),
    ({"name": "x", "sizes": [1.5]}, "sizes[0]", "must be an integer, got 1.5, not an integer"),
    ({"name": "x", "ratio": float("nan")}, "ratio", "must be a finite number, got NaN"),
    ({"name": "x", "ratio": float("inf")}, "ratio", "must be a finite number, got infinite (inf)"),
    # a mapping's entry: msgspec reports `entries[...]`, the key is found again from the data
    ({"name": "x", "entries": {"a": {"kind": "compute"}, "b": {"kind": "speed"}}}, "entries.b.kind",
     "must be one of ['compute', 'bandwidth'], got 'speed'"),
    ({"name": "x", "entries": {"a": {"kind": "bandwidth", "value": 0}}}, "entries.a.value",
     "must be positive, got 0 (the rate)"),
    ({"name": "x", "entries": {"a": {"kind": "compute", "value": 11}}}, "entries.a.value", "is too fast for compute"),
    ({"name": "x", "entries": {"a": {"kind": "compute", "note": " "}}}, "entries.a.note", "must not be empty or blank"),
    ({"name": "x", "entries": {3: {"kind": "compute"}}}, "entries", "has a key that is not a string (3)"),
    ({"name": "x", "sizes": {}}, "sizes", "must be a list, got a mapping"),
])
def test_an_invalid_document_is_one_line_naming_file_and_field(data, field, message):
    with pytest.raises(ConfigError) as info:
        convert(data, Doc, source="spec.yaml")
    err = info.value
    assert (err.source, err.field, err.message) == ("spec.yaml", field, message)
    assert str(err) == f"spec.yaml: field '{field}': {message}"


def test_prefix_error_class_and_unprintable_keys():
    with pytest.raises(RequestError) as info:
        convert({"name": "x", "a\nb": 1}, Doc, source="r.jsonl:3", prefix="outer", error=RequestError)
    assert str(info.value) == "r.jsonl:3: field 'outer.a\\nb': unknown field (known: name, entries, sizes, ratio)"
    assert convert({"name": "x", "sizes": [2]}, Doc, source="s").sizes == [2]


def test_decode_json_strict_and_typed():
    assert decode_json(b'{"name": "x", "ratio": 0.25}', Doc, source="d.json").ratio == 0.25
    with pytest.raises(ConfigError, match=r"d.json: is not valid JSON"):
        decode_json(b'{"name": NaN}', Doc, source="d.json")
    with pytest.raises(ConfigError, match=r"d.json: field 'sizes\[0\]': must be >= 1, got 0"):
        decode_json(b'{"name": "x", "sizes": [0]}', Doc, source="d.json")


def test_invalid_is_a_config_error_when_raised_directly():
    with pytest.raises(ConfigError, match="field 'value': is too fast"):
        Entry(kind="compute", value=20.0)


def test_the_one_strict_json_writer(tmp_path):
    value = {"a": float("nan"), "b": [float("inf"), 1.5, (float("-inf"),)], "c": "NaN"}
    assert json.loads(dumps(value)) == {"a": None, "b": [None, 1.5, [None]], "c": "NaN"}
    assert json.loads(dumps(value, list_nonfinite=True))["nonfinite"] == ["a", "b.0", "b.2.0"]
    assert dumps({"x": 1}) == '{"x": 1}' and dumps({"x": 1, "y": [0.5]}, compact=True) == '{"x":1,"y":[0.5]}'
    assert dumps({"x": float("nan"), "n": 2**70}, compact=True) == '{"x":null,"n":1180591620717411303424}'
    write_json(tmp_path / "o.json", value, indent=2)
    assert json.loads((tmp_path / "o.json").read_text())["b"] == [None, 1.5, [None]]
    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]  # no temporary file left


def test_strict_yaml_refuses_a_duplicate_key(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("a: 1\nb: {c: 2}\na: 3\n")
    with pytest.raises(ConfigError, match=r"d.yaml: field 'a': has the key 'a' twice \(line 1 and line 3\)"):
        read_yaml(path)
    path.write_text("a: 1\n")
    assert read_yaml(path) == (b"a: 1\n", {"a": 1})


@pytest.mark.parametrize("values", [[3.0], [1, 2], [5.0, 1.0, 3.0], [0.1, 0.7, 0.2, 0.9], list(range(11))])
def test_median_is_statistics_median(values):
    assert median(values) == float(statistics.median(values)) and type(median(values)) is float
