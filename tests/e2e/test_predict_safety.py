"""`dohnuts predict` never destroys its input, never dies on one bad line, and ends every user
error in one line on stderr with exit status 2 (a closed stdout: quietly, status 141)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dohnuts.cli import main
from dohnuts.runtime.requests import read_requests
from tests.hostile import HOSTILE_ADAPTER_IDS, HOSTILE_ADAPTER_META, hostile_adapter

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"id": "r1", "questions": [{"id": "q1", "text": "Which is red?", "candidates": ["red", "green"]}]}


def _jsonl(path: Path, *lines: bytes | str | dict) -> Path:
    raw = [line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode()
           for line in lines]
    path.write_bytes(b"\n".join(raw) + b"\n")
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- 1. the output is the input ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["same path", "other spelling", "symlink", "hard link"])
def test_output_that_is_the_input_is_refused_and_input_untouched(tmp_path, capsys, how):
    src = _jsonl(tmp_path / "same.jsonl", GOOD, {**GOOD, "id": "r2"})
    before = src.read_bytes()
    (tmp_path / "sub").mkdir()
    if how == "same path":
        out = src
    elif how == "other spelling":
        out = tmp_path / "sub" / ".." / "same.jsonl"
    elif how == "symlink":
        out = tmp_path / "link.jsonl"
        out.symlink_to(src)
    else:
        out = tmp_path / "hard.jsonl"
        os.link(src, out)
    assert main(["predict", str(src), "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "is an input of this command" in line and str(out) in line
    assert src.read_bytes() == before


@pytest.mark.slow
def test_stdout_appended_to_the_input_is_refused(tmp_path):
    src = _jsonl(tmp_path / "same.jsonl", GOOD)
    before = src.read_bytes()
    with open(src, "ab") as out:
        p = subprocess.run([sys.executable, "-m", "dohnuts.cli", "predict", str(src)], check=False, cwd=ROOT,
                           stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "redirected to this input file" in p.stderr
    assert src.read_bytes() == before


# -- 2. one bad line does not kill the run ---------------------------------------------------------

def test_deep_nesting_and_bad_bytes_fail_only_their_line(tmp_path, capsys):
    src = _jsonl(tmp_path / "requests.jsonl",
                 GOOD,
                 b"[" * 100_000 + b"]" * 100_000,                       # RecursionError in json.loads
                 b'{"id": "r\xff\xfe", "questions": []}',                # not UTF-8
                 b'{"id": "r4", "questions": [{"text": "\\ud800?", "candidates": ["a"]}]}',  # lone surrogate
                 b'{"id": "r5", "questions": [{"text": "x?", "candidates": ["a"], "rewards": [NaN]}]}',
                 b'{"id": ' + b"9" * 5000 + b"}",                        # too many digits for int()
                 {**GOOD, "id": "r7"})
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out)]) == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 7
    assert records[0]["id"] == "r1" and records[-1]["id"] == "r7"
    assert records[0]["questions"] == records[-1]["questions"]
    errors = {r["line"]: r["error"] for r in records if "error" in r}
    assert set(errors) == {2, 3, 4, 5, 6}
    assert "nested too deeply" in errors[2]
    assert "requests.jsonl:3: is not UTF-8" in errors[3]
    assert "questions[0].text" in errors[4] and "surrogate" in errors[4]
    assert "questions[0].rewards" in errors[5] and "NaN" in errors[5]
    assert "too many digits" in errors[6]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "scored 2 of 7 requests, refused 5" in err
    for n in (2, 3, 4, 5, 6):
        assert f"requests.jsonl:{n}: " in err


def test_line_numbers_follow_universal_newlines(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_bytes(json.dumps(GOOD).encode() + b"\r\n\r\n" + b"{bad\r" + json.dumps(GOOD).encode() + b"\n")
    items = list(read_requests(src))
    assert [n for n, _ in items] == [1, 3, 4]
    assert [type(x).__name__ for _, x in items] == ["Request", "RequestError", "Request"]


# -- 3. tracebacks that are now one line -----------------------------------------------------------

def test_output_in_a_missing_directory(tmp_path, capsys):
    src = _jsonl(tmp_path / "r.jsonl", GOOD)
    assert main(["predict", str(src), "-o", str(tmp_path / "nope" / "out.jsonl")]) == 2
    assert "does not exist" in _one_error_line(capsys)


def test_output_that_is_a_directory(tmp_path, capsys):
    src = _jsonl(tmp_path / "r.jsonl", GOOD)
    assert main(["predict", str(src), "-o", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert str(tmp_path) in line and "is a directory" in line


def test_input_that_is_a_directory(tmp_path, capsys):
    assert main(["predict", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert str(tmp_path) in line and "is a directory" in line


def test_unknown_device(tmp_path, capsys):
    src = _jsonl(tmp_path / "r.jsonl", GOOD)
    assert main(["predict", str(src), "--device", "banana"]) == 2
    assert "--device banana" in _one_error_line(capsys)
    assert main(["predict", str(src), "--device", "meta"]) == 2
    assert "not supported" in _one_error_line(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(tmp_path, capsys):
    src = _jsonl(tmp_path / "r.jsonl", GOOD)
    assert main(["predict", str(src), "--device", "cuda"]) == 2
    line = _one_error_line(capsys)
    assert "--device cuda" in line and "CUDA is not available" in line


@pytest.mark.slow
def test_broken_pipe_stops_quietly(tmp_path):
    src = _jsonl(tmp_path / "r.jsonl", *({**GOOD, "id": f"r{i}"} for i in range(200)))
    script = (f"{sys.executable} -m dohnuts.cli predict {src} 2>{tmp_path / 'err.txt'} | head -1; "
              "echo ${PIPESTATUS[0]} >" + str(tmp_path / "rc.txt"))
    p = subprocess.run(["bash", "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert json.loads(p.stdout.splitlines()[0])["id"] == "r0" and len(p.stdout.splitlines()) == 1
    err = (tmp_path / "err.txt").read_text()
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipeError" not in err
    assert int((tmp_path / "rc.txt").read_text()) in (0, 141)  # 141 when the pipe closed before the end


# -- 4. the stderr line and the blamed field -------------------------------------------------------

def test_image_error_on_stderr_names_the_line(tmp_path, capsys):
    src = _jsonl(tmp_path / "requests.jsonl", GOOD, GOOD, {**GOOD, "id": "r3", "image": "missing.png"})
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out)]) == 2
    record = json.loads(out.read_text().splitlines()[2])
    assert record["line"] == 3 and "missing.png" in record["error"]
    err = capsys.readouterr().err
    (line,) = [e for e in err.splitlines() if "missing.png" in e]
    assert line.startswith(f"dohnuts: {src}:3: ")


def test_over_long_question_blames_the_text(tmp_path, capsys):
    long_q = {"id": "r2", "questions": [GOOD["questions"][0], {"id": "q2", "text": "x" * 9000, "candidates": ["a"]}]}
    src = _jsonl(tmp_path / "requests.jsonl", GOOD, long_q)
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(src), "-o", str(out)]) == 2
    record = json.loads(out.read_text().splitlines()[1])
    assert "field 'questions[1].text'" in record["error"] and "over the context of 8192" in record["error"]
    assert "candidates" not in record["error"]


# -- rewards and answers -----------------------------------------------------------------------------

@pytest.mark.parametrize("question, field, why", [
    ('"rewards": [NaN, 1]', "rewards", "NaN"),
    ('"rewards": [0, Infinity]', "rewards", "infinite"),
    ('"rewards": [-Infinity, 0]', "rewards", "infinite"),
    ('"rewards": [1e400, 0]', "rewards", "infinite"),
    ('"rewards": [true, false]', "rewards", "boolean"),
    ('"rewards": [' + "9" * 400 + ', 0]', "rewards", "too large"),
    ('"answer": NaN', "answer", "NaN"),
    ('"answer": Infinity', "answer", "infinite"),
    ('"answer": true', "answer", "boolean"),
    ('"answer": 1.0', "answer", "not an integer"),
])
def test_non_finite_rewards_and_bool_answers_are_refused(tmp_path, question, field, why):
    src = tmp_path / "r.jsonl"
    src.write_text('{"id": "r", "questions": [{"text": "t?", "candidates": ["a", "b"], ' + question + "}]}\n")
    ((_, err),) = list(read_requests(src))
    assert type(err).__name__ == "RequestError"
    # a reward is named by its element (questions[0].rewards[1]), an answer by its field
    assert err.field.startswith(f"questions[0].{field}") and why in err.message and "\n" not in str(err)
    assert str(err).startswith(f"{src}:1: field 'questions[0].{field}")


# -- 5. hostile paths: refused by type and size before any read; the other lines are scored -------------

def test_devices_fifos_sockets_and_long_names_as_images_fail_only_their_line(tmp_path, capsys):
    """/dev/zero was read whole (MemoryError), a FIFO blocked forever, an over-long name raised
    OSError: each now fails its own line, by its stat, and the good line after them is scored."""
    from tests.hostile import LONG_NAME, fifo, no_hang, unix_socket

    pipe = fifo(tmp_path / "pipe.png")
    with unix_socket(tmp_path / "sock.png") as sock, no_hang(300):
        src = _jsonl(tmp_path / "r.jsonl", *({**GOOD, "id": f"bad{i}", "image": str(p)} for i, p in
                                             enumerate(["/dev/zero", pipe, sock, LONG_NAME, tmp_path])),
                     {**GOOD, "id": "good"})
        out = tmp_path / "out.jsonl"
        assert main(["predict", str(src), "-o", str(out)]) == 2
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["bad0", "bad1", "bad2", "bad3", "bad4", "good"]
    assert "questions" in records[-1]
    whys = ["is a character device", "is a FIFO (named pipe)", "is a socket", "has a name longer than the file "
            "system allows", "is a directory"]
    for record, why in zip(records, whys):
        assert why in record["error"] and "\n" not in record["error"], record
    err = capsys.readouterr().err
    assert "Traceback" not in err and "scored 1 of 6 requests, refused 5" in err


def test_fifo_or_device_as_adapter_output_or_input_is_one_line(tmp_path, capsys):
    from tests.hostile import fifo, no_hang

    src = _jsonl(tmp_path / "r.jsonl", GOOD)
    pipe = fifo(tmp_path / "pipe")
    with no_hang(300):
        for args, why in [(["--adapter", str(pipe)], "field '--adapter': is a FIFO (named pipe), not an adapter file"),
                          (["--adapter", "/dev/zero"], "is a character device, not an adapter file"),
                          (["-o", str(pipe)], "field '-o': is a FIFO (named pipe), not a JSONL file to write"),
                          (["-o", "/dev/full"], "field '-o': is a character device"),
                          (["-o", str(tmp_path / ("y" * 300))], "longer than the file system allows")]:
            assert main(["predict", str(src), *args]) == 2
            assert why in _one_error_line(capsys)
        assert main(["predict", "/dev/zero"]) == 2
        assert "/dev/zero: is a character device, not a JSONL file" in _one_error_line(capsys)


@pytest.mark.parametrize("meta, field, why", HOSTILE_ADAPTER_META, ids=HOSTILE_ADAPTER_IDS)
def test_hostile_adapter_metadata_through_predict_is_one_line_and_writes_nothing(tmp_path, capsys, meta, field, why):
    """`predict --adapter` with hostile metadata was a traceback (or, for a temperature, inverted
    probabilities with exit 0): one line naming the file and the field, and no output file."""
    bad = hostile_adapter(tmp_path / "bad.safetensors", meta)
    src, out = _jsonl(tmp_path / "r.jsonl", GOOD), tmp_path / "out.jsonl"
    assert main(["predict", str(src), "--adapter", str(bad), "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"{bad}: field '{field}': " in line and why in line, line
    assert not out.exists()


@pytest.mark.parametrize("config, weights, why", [
    ({"rms_norm_eps": float("nan")}, None, "config.json: field 'rms_norm_eps': must be a finite number, got NaN"),
    ({"rope_theta": float("inf")}, None, "config.json: field 'rope_theta': must be a finite number, got infinite"),
    ({"max_position_embeddings": -5}, None, "config.json: field 'max_position_embeddings': must be an integer in 1.."),
    ({}, "norm.weight", "model.safetensors: tensor 'norm.weight' holds non-finite values (NaN or infinite)"),
])
def test_a_checkpoint_with_non_finite_or_absurd_numbers_through_predict_is_one_line(tmp_path, capsys, config, weights,
                                                                                   why):
    """A NaN in config.json or in a weight once gave 'scored 3 of 3 requests', exit 0, every
    probability null; `max_position_embeddings: -5` was accepted: one line naming the file and field."""
    from tests.model.test_checkpoint import _tiny_checkpoint

    def nan(sd):
        sd[weights] = sd[weights].clone().fill_(float("nan"))

    root = _tiny_checkpoint(tmp_path / "ckpt", config=lambda c: c.update(config), mutate=nan if weights else None)
    src, out = _jsonl(tmp_path / "r.jsonl", *({**GOOD, "id": f"r{i}"} for i in range(3))), tmp_path / "out.jsonl"
    assert main(["predict", str(src), "--model", str(root), "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"dohnuts: error: {root}/") and why in line, line
    assert not out.exists()


@pytest.mark.slow
def test_a_full_disk_keeps_every_complete_record_and_no_cut_line(tmp_path):
    """The disk fills during a record (simulated: the output cannot grow past 1500 bytes): the file
    ends at its last complete record, and the error says so in one line."""
    from tests.hostile import run_with_full_disk

    src = _jsonl(tmp_path / "r.jsonl", *({**GOOD, "id": f"r{i}"} for i in range(12)))
    out = tmp_path / "out.jsonl"
    p = run_with_full_disk(["-m", "dohnuts", "predict", str(src), "-o", str(out)], 1500)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dohnuts: error: {out}: cannot be written (File too large); the file ends at its last "
                           "complete record;") and "records written" in last
    data = out.read_bytes()
    assert data.endswith(b"\n") and 1500 - 200 < len(data) <= 1500
    assert [json.loads(x)["id"] for x in data.splitlines()] == [f"r{i}" for i in range(len(data.splitlines()))]
