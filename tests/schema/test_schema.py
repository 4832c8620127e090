"""dohnuts.schema: msgspec's refusals as the project's one-line errors (file, field path, problem),
the one strict-JSON writer, strict YAML, and the shared helpers."""

from __future__ import annotations

import json
import os
import subprocess
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
    with pytest.raises(ConfigError, match=r"^d.json: field 'name': must be a finite number, got NaN$"):
        decode_json(b'{"name": NaN}', Doc, source="d.json")
    with pytest.raises(ConfigError, match=r"^d.json: is not valid JSON"):
        decode_json(b'{"name": ', Doc, source="d.json")
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


# -- user paths: refused by type, name and size before anything is opened -------------------------------

def test_special_files_are_refused_by_type_before_any_read(tmp_path):
    from dohnuts.schema import check_file, open_file, read_file
    from tests.hostile import LONG_NAME, fifo, no_hang, unix_socket

    pipe = fifo(tmp_path / "pipe")
    with unix_socket(tmp_path / "sock") as sock, no_hang():
        cases = [("/dev/zero", "is a character device"), (pipe, "is a FIFO (named pipe)"), (sock, "is a socket"),
                 (tmp_path, "is a directory"), (tmp_path / "missing", "does not exist"),
                 (tmp_path / LONG_NAME, "has a name longer than the file system allows (a component of 304 bytes"),
                 ("a\0b", "holds a NUL character")]
        for path, why in cases:
            for read in (lambda p: check_file(p, error=ConfigError, field="f"),
                         lambda p: read_file(p, max_bytes=10, error=ConfigError, field="f"),
                         lambda p: open_file(p, error=ConfigError, field="f")):
                with pytest.raises(ConfigError) as info:
                    read(path)
                assert why in str(info.value) and "field 'f'" in str(info.value) and "\n" not in str(info.value)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 11)
    with pytest.raises(ConfigError, match=r"big.bin: is 11 bytes, over the 10 bytes limit"):
        read_file(big, max_bytes=10, error=ConfigError)
    assert read_file(big, max_bytes=11, error=ConfigError) == b"x" * 11


def test_a_pipe_is_read_as_a_stream_where_streams_are_allowed(tmp_path):
    from dohnuts.schema import open_file
    from tests.hostile import no_hang

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with no_hang():
        writer = subprocess.Popen(["sh", "-c", f"printf 'a\\nb\\n' > {pipe}"])
        with open_file(pipe, error=ConfigError, streams=True) as f:
            assert f.read() == b"a\nb\n"
        writer.wait()


def test_a_pipe_whose_writer_came_and_went_while_it_was_checked_is_read_whole(tmp_path, monkeypatch):
    """A writer that opens the pipe, writes and closes between the reader's open and its checks (a
    short writer, a loaded machine): its bytes are read, not lost to a second open that then waits
    for a writer that has gone (seen: a 300-s hang of the test above)."""
    import dohnuts.schema.user_files as user_files
    from dohnuts.schema import open_file
    from tests.hostile import no_hang

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    real_fstat, inode, wrote = os.fstat, os.stat(pipe).st_ino, []

    def fstat_after_a_writer(fd):
        st = real_fstat(fd)
        if st.st_ino == inode and not wrote:  # the reader's check of the pipe, once (other callers untouched)
            w = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # succeeds: the reader has it open
            os.write(w, b"a\nb\n")
            os.close(w)
            wrote.append(True)
        return st

    monkeypatch.setattr(user_files.os, "fstat", fstat_after_a_writer)
    with no_hang(120):
        with open_file(pipe, error=ConfigError, streams=True) as f:
            monkeypatch.setattr(user_files.os, "fstat", real_fstat)
            assert wrote and f.read() == b"a\nb\n"


def test_outputs_must_be_new_or_regular_files(tmp_path):
    from dohnuts.schema import check_output
    from tests.hostile import LONG_NAME, fifo

    check_output(tmp_path / "new.json", error=ConfigError)  # a new file in a folder that exists
    (tmp_path / "old.json").write_text("{}")
    check_output(tmp_path / "old.json", error=ConfigError)
    for path, why in [("/dev/full", "is a character device"), (fifo(tmp_path / "p"), "is a FIFO"),
                      (tmp_path, "is a directory"), (tmp_path / "no" / "x.json", "the folder"),
                      (tmp_path / "old.json" / "x.json", "is a regular file, not a folder"),
                      (tmp_path / LONG_NAME, "longer than the file system allows")]:
        with pytest.raises(ConfigError, match=why):
            check_output(path, error=ConfigError, field="--json")


@pytest.mark.parametrize("limit", [0, 30, 95, 100])
def test_a_full_disk_leaves_the_jsonl_valid_up_to_its_last_complete_record(tmp_path, limit):
    """Each record is one whole write or none: the file never ends in a cut line (a process whose
    files cannot grow past `limit` bytes: every write that crosses it is cut short, then fails)."""
    from tests.hostile import run_with_full_disk

    out = tmp_path / "out.jsonl"
    code = ("import sys\nfrom dohnuts.schema import JsonlFile, dumps\nfrom dohnuts.errors import ConfigError\n"
            f"with JsonlFile({str(out)!r}, error=ConfigError) as f:\n"
            "    for i in range(10):\n"
            "        try:\n"
            "            f.write_line(dumps({'i': i, 'pad': 'x' * 20}))\n"
            "        except ConfigError as e:\n"
            "            print(e, file=sys.stderr); sys.exit(2)\n")
    p = run_with_full_disk(["-c", code], limit)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "cannot be written (File too large); the file ends at its last complete record" in p.stderr
    data = out.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    lines = data.splitlines()
    assert [json.loads(x)["i"] for x in lines] == list(range(len(lines)))
    size = len(dumps({"i": 0, "pad": "x" * 20})) + 1  # every record has this many bytes, its newline included
    assert len(lines) == limit // size and len(data) == size * len(lines)


# -- YAML: bounded, and numbers as YAML 1.2 reads them -------------------------------------------------

def test_yaml_aliases_that_expand_without_bound_are_refused(tmp_path):
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + [
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcde", "bcdef")]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    assert len(bomb.read_bytes()) < 600  # 10^6 values once expanded
    with pytest.raises(ConfigError, match=r"bomb.yaml: expands to more than 100,000 values through its aliases"):
        read_yaml(bomb)
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="expands to more than"):
        read_yaml(loop)
    fine = tmp_path / "fine.yaml"
    fine.write_text("base: &b {x: 1}\none: *b\ntwo: *b\n")
    assert read_yaml(fine)[1] == {"base": {"x": 1}, "one": {"x": 1}, "two": {"x": 1}}


def test_yaml_exponent_numbers_are_numbers(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("a: 1e12\nb: -5E-3\nc: 2.5e3\nd: '1e12'\ne: 12\n")
    assert read_yaml(f)[1] == {"a": 1e12, "b": -5e-3, "c": 2500.0, "d": "1e12", "e": 12}


def test_yaml_files_are_bounded_and_special_files_refused(tmp_path, monkeypatch):
    import dohnuts.schema.strict_yaml as strict_yaml

    from tests.hostile import fifo, no_hang

    with no_hang():
        with pytest.raises(ConfigError, match="is a FIFO"):
            read_yaml(fifo(tmp_path / "w.yaml"))
        with pytest.raises(ConfigError, match="/dev/zero: is a character device, not a YAML file"):
            read_yaml("/dev/zero")
    monkeypatch.setattr(strict_yaml, "MAX_YAML_BYTES", 100)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 200 + "\n")
    with pytest.raises(ConfigError, match="big.yaml: is 204 bytes, over the 100 bytes limit for a YAML file"):
        read_yaml(big)
