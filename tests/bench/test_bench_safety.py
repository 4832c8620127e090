"""dohnuts-bench under bad input and faults: bounded sizes and the context checked before anything
is measured, a linear text filler, atomic run directories, one-line errors (exit 2) instead of
tracebacks, Ctrl-C during the report, strict JSON, no empty run directories, out-of-memory
targets recorded as failed while the run goes on."""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from dohnuts.bench.cli import main
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.measure.workload import load_workload
from dohnuts.errors import ConfigError
from tests.bench.test_bench_harness import _registry
from tests.hostile import HOSTILE_ADAPTER_IDS, HOSTILE_ADAPTER_META, SMALL_TEXT_WORKLOAD, hostile_adapter

SMALL = SMALL_TEXT_WORKLOAD


def _workload(tmp_path: Path, text: str = SMALL, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    assert "Traceback" not in err[0]
    return err[0]


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def _plugins(monkeypatch, *extra):
    """Run the CLI with extra plugin objects registered (as tests/test_bench_harness does)."""
    from dohnuts.bench import plugins

    real = plugins.plugin_manager

    def with_extra(extra_plugins=(), **kw):
        return real(extra=(*extra, *extra_plugins), **kw)

    monkeypatch.setattr(plugins, "plugin_manager", with_extra)


@pytest.fixture(scope="module", autouse=True)
def _small_ceiling_benchmarks():
    """The CPU ceilings measured at the start of each run, on small sizes (these tests run many
    short runs; the numbers only need to exist)."""
    import functools

    from dohnuts_bench_plugins.analyzers import microbench

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(microbench, "measure_cpu_ceilings",
                   functools.partial(microbench.measure_cpu_ceilings, n=128, copy_bytes=1 << 20, vector=1 << 12))
        yield


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory, _small_ceiling_benchmarks) -> Path:
    """One small real run: its results.jsonl feeds the `analyze` tests."""
    out = tmp_path_factory.mktemp("run")
    assert main(["run", str(_workload(out)), "--out", str(out / "runs"), "--quiet"]) == 0
    (run_dir,) = list((out / "runs").iterdir())
    return run_dir


def _copy_results(run_dir: Path, dest: Path, edit=None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    if edit is not None:
        lines = [edit(line) for line in lines]
    path = dest / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# 1. Bounded sizes, the context checked when the file is validated, a linear filler


BOUNDS = {
    "questions": ("shape: {questions: 100000000}", "shape.questions", "must be <= 4096"),
    "seq_tokens": ("shape: {seq_tokens: 3000000}", "shape.seq_tokens", "must be <= 262144"),
    "requests": ("shape: {requests: 5000}", "shape.requests", "must be <= 1024"),
    "candidates": ("shape: {candidates: 100000}", "shape.candidates", "must be <= 1024"),
    "min_duration_inf": ("min_duration_s: .inf", "min_duration_s", "must be a finite number"),
    "min_duration_nan": ("min_duration_s: .nan", "min_duration_s", "must be a finite number"),
    "min_duration_day": ("min_duration_s: 86401", "min_duration_s", "must be <= 86400"),
    # YAML 1.1 read `1e12` as the string '1e12' (a type error): it is the number it looks like
    "min_duration_exponent": ("min_duration_s: 1e12", "min_duration_s", "must be <= 86400.0, got 1000000000000.0"),
    "halfwidth_nan": ("halfwidth: .nan", "halfwidth", "must be a finite number"),
    "repeat": ("repeat: 1000000", "repeat", "must be <= 10000"),
    "warmup": ("warmup: 100000", "warmup", "must be <= 1000"),
    "max_repeat": ("max_repeat: 10000000", "max_repeat", "must be <= 100000"),
    "seed": ("seed: -1", "seed", "must be >= 0"),
    "generated_text": ("shape: {requests: 1024, questions: 4096, seq_tokens: 64}", "shape.seq_tokens",
                       "tokens of generated text"),
    "context": ("shape: {seq_tokens: 9000}", "shape.seq_tokens", "over the 8192-token context of model 'tiny'"),
    "context_on_gpu": ("on_gpu: {shape: {seq_tokens: 9000}}", "on_gpu.shape.seq_tokens", "context"),
}


@pytest.mark.parametrize("case", sorted(BOUNDS))
def test_sizes_out_of_bounds_are_refused_before_anything_runs(case, tmp_path, capsys):
    text, field, message = BOUNDS[case]
    path = _workload(tmp_path, f"kind: text\n{text}\n")
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
    _one_line_error(capsys, str(path), f"field '{field}'", message)
    assert not (tmp_path / "runs").exists()


def test_image_tokens_count_against_the_context(tmp_path):
    kinds, targets = _registry()
    fits = _workload(tmp_path, "kind: image\nshape: {seq_tokens: 7000, resolution: [1024, 1024]}\n")
    spec = load_workload(fits, kinds, targets, gpu=False)
    from dohnuts.config import preset

    assert kinds["image"].sequence_tokens(spec.shape, preset("tiny"), source="") == 7000 + 1024 + 2
    over = _workload(tmp_path, "kind: image\nshape: {seq_tokens: 8000, resolution: [1024, 1024]}\n")
    with pytest.raises(ConfigError, match=r"field 'shape.seq_tokens': is 8000, and with the largest image's 1026 "
                                          r"tokens \(markers included\) a sequence holds 9026: over the 8192-token "
                                          r"context"):
        load_workload(over, kinds, targets, gpu=False)


def test_the_longest_sequence_that_fits_is_accepted(tmp_path):
    kinds, targets = _registry()
    spec = load_workload(_workload(tmp_path, "kind: text\nshape: {seq_tokens: 8192}\n"), kinds, targets, gpu=False)
    assert spec.shape.seq_tokens == 8192


def test_a_checkpoints_max_position_embeddings_bounds_the_sequence(tmp_path):
    from dohnuts.config import preset
    from dohnuts.hf_config import to_hf_text_config

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = {**to_hf_text_config(preset("tiny").text), "model_type": "qwen3_5_text", "max_position_embeddings": 512}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    kinds, targets = _registry()
    ok = _workload(tmp_path, f"kind: text\nmodel: {ckpt}\nshape: {{seq_tokens: 512}}\n", "ok.yaml")
    assert load_workload(ok, kinds, targets, gpu=False).model == str(ckpt)
    over = _workload(tmp_path, f"kind: text\nmodel: {ckpt}\nshape: {{seq_tokens: 600}}\n", "over.yaml")
    with pytest.raises(ConfigError, match=r"over.yaml: field 'shape.seq_tokens': is 600: over the 512-token "
                                          r"context .*max_position_embeddings 512"):
        load_workload(over, kinds, targets, gpu=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_bytes(b"\xff\xfe{")
    bad = _workload(tmp_path, f"kind: text\nmodel: {broken}\n", "bad.yaml")
    with pytest.raises(ConfigError, match=r"bad.yaml: field 'model': is not a usable checkpoint"):
        load_workload(bad, kinds, targets, gpu=False)


def test_an_over_context_workload_stops_the_run_before_earlier_ones_are_measured(tmp_path, capsys):
    good = _workload(tmp_path, SMALL, "good.yaml")
    long = _workload(tmp_path, SMALL.replace("seq_tokens: 64", "seq_tokens: 10000"), "long.yaml")
    assert main(["run", str(good), str(long), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, "long.yaml", "field 'shape.seq_tokens'")
    assert not (tmp_path / "runs").exists()  # nothing was measured, nothing is left behind


def _quadratic_filler(tokenizer, n_tokens, rng):
    """The filler as it was (one encode per word): the reference the linear one must equal."""
    import string

    if n_tokens <= 0:
        return ""
    words = []
    while True:
        words.append("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))))
        text = " ".join(words)
        if len(tokenizer.encode(text)) >= n_tokens:
            break
    if len(tokenizer.encode(text)) > n_tokens and getattr(tokenizer, "name", "") == "bytes":
        text = text[:n_tokens]
    return text


class _CountingTokenizer:
    """The byte tokenizer, counting the characters it is asked to encode."""

    name = "bytes"

    def __init__(self):
        self.encoded = 0

    def encode(self, text: str) -> list[int]:
        self.encoded += len(text)
        return list(text.encode("utf-8"))


class _SubwordTokenizer:
    """A stand-in for a checkpoint's tokenizer: about two characters a token, and a BOS."""

    name = "tokenizer.json"

    def encode(self, text: str) -> list[int]:
        return [0] * (1 + (len(text) + 1) // 2)


def test_filler_is_linear_and_draws_exactly_what_the_quadratic_one_drew():
    from dohnuts_bench_plugins.workloads import filler

    for tok in (_CountingTokenizer(), _SubwordTokenizer()):
        for seed in range(4):
            a, b = random.Random(seed), random.Random(seed)
            for n in (1, 2, 5, 16, 17, 100, 999, 4096):
                assert filler(tok, n, a) == _quadratic_filler(tok, n, b)
                assert a.getstate() == b.getstate()  # every later draw is the same too
    tok = _CountingTokenizer()
    n = 200_000
    text = filler(tok, n, random.Random(0))
    assert len(text) == n
    assert tok.encoded <= 40 * n  # word by word it encoded ~n²/12 characters (3e9 here)


# ---------------------------------------------------------------------------------------------
# 2. Run directories are created atomically


def test_concurrent_run_directories_never_collide(tmp_path, monkeypatch):
    from dohnuts.bench.store import rundir

    monkeypatch.setattr(rundir.time, "strftime", lambda fmt: "20270101-000000")  # every creator collides
    barrier = threading.Barrier(48)
    made, errors = [], []

    def create():
        try:
            barrier.wait()
            made.append(rundir.new_run_dir(tmp_path / "runs", "same")[1])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(made) == len(set(made)) == 48 and all(p.is_dir() for p in made)
    assert {p.name for p in made} == {"20270101-000000-same"} | {f"20270101-000000-same-{n}" for n in range(2, 49)}


def test_labels_and_workload_names_stay_inside_the_run_directory(tmp_path):
    from dohnuts.bench.store.rundir import new_run_dir, safe_name

    _, path = new_run_dir(tmp_path, "../../etc/x y")
    assert path.parent == tmp_path and "/" not in path.name and ".." not in path.name
    assert safe_name("../..") == "run" and safe_name("text-2b") == "text-2b"


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "not-a-dir"
    out.write_text("keep me")
    assert main(["run", str(_workload(tmp_path)), "--out", str(out)]) == 2
    _one_line_error(capsys, str(out), "field '--out'", "is not a directory")
    assert out.read_text() == "keep me"


# ---------------------------------------------------------------------------------------------
# 3. One line and exit 2 (or 130), never a traceback


def test_a_workload_path_that_is_a_directory(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--out", str(tmp_path / "runs")]) == 2
    _one_line_error(capsys, str(tmp_path), "is a directory")


@pytest.mark.parametrize("content, message", [
    (b"\x00\x01\xff\xfe\x89PNG\r\n\x1a\n", "is not utf-8 text"),
    (b"name: caf\xe9\n", "is not utf-8 text"),  # latin-1
    (b"name: [unclosed\n", "is not valid YAML at line"),
    (b"name: a\x07b\n", "unacceptable character #x0007"),
    (b"ceilings: {a: 1}\nceilings: {b: 2}\n", "has the key 'ceilings' twice (line 1 and line 2)"),
])
def test_unreadable_hwspec_files_are_one_line(tmp_path, capsys, content, message):
    spec = tmp_path / "gpu.yaml"
    spec.write_bytes(content)
    assert main(["run", str(_workload(tmp_path)), "--hwspec", str(spec), "--out", str(tmp_path / "runs")]) == 2
    _one_line_error(capsys, str(spec), message)
    assert not (tmp_path / "runs").exists()


class _InterruptReport:
    """Ctrl-C during the measured call 2 (optionally) and again while the report is written."""

    def __init__(self, during_run: bool):
        self.during_run = during_run

    @hookimpl
    def dohnuts_bench_after_call(self, run, spec, target_name, record):
        if self.during_run and record.iteration == 2:
            raise KeyboardInterrupt

    @hookimpl
    def dohnuts_bench_analyze(self, records, hwspec, measured, run_dir):
        raise KeyboardInterrupt


@pytest.mark.parametrize("during_run", [True, False], ids=["second-ctrl-c", "ctrl-c-in-report"])
def test_ctrl_c_during_the_report_exits_130_with_results_intact(tmp_path, monkeypatch, capsys, during_run):
    _plugins(monkeypatch, _InterruptReport(during_run))
    path = _workload(tmp_path, SMALL.replace("repeat: 2", "repeat: 4"))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted while writing the report" in err
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = [_strict_json(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    iterations = [r["iteration"] for r in records if r["phase"] != "stream"]
    assert iterations == ([-1, 0, 1] if during_run else [-1, 0, 1, 2, 3])
    assert all(r["schema"] == 2 for r in records)
    assert _strict_json((run_dir / "run.json").read_text())["run_id"] == run_dir.name


class _Terminate:
    """SIGTERM to this process at the measured call 2, before its record (as a time limit sends it)."""

    @hookimpl
    def dohnuts_bench_after_call(self, run, spec, target_name, record):
        if record.iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_sigterm_keeps_the_run_as_ctrl_c_does_exit_143(tmp_path, monkeypatch, capsys):
    # Without the handler Python dies at once: results.jsonl whole but no run.json (the measured
    # ceilings, so no bound) and no report — what `timeout` left of a profiled suite (M66).
    _plugins(monkeypatch, _Terminate())
    missed: list[int] = []

    def guard(signum, frame):  # where `run` installs no handler of its own: counted, the test process lives
        missed.append(signum)

    original = signal.signal(signal.SIGTERM, guard)
    try:
        path = _workload(tmp_path, SMALL.replace("repeat: 2", "repeat: 4"))
        code = main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"])
        assert signal.getsignal(signal.SIGTERM) is guard  # the process's handler back after the run
    finally:
        signal.signal(signal.SIGTERM, original)
    assert not missed and code == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = [_strict_json(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records if r["phase"] != "stream"] == [-1, 0, 1]
    meta = _strict_json((run_dir / "run.json").read_text())
    assert meta["run_id"] == run_dir.name and meta["measured"]  # the ceilings measured before the calls
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.txt").is_file()


def test_ctrl_c_during_analyze_exits_130(measured_run, tmp_path, monkeypatch, capsys):
    _plugins(monkeypatch, _InterruptReport(during_run=False))
    assert main(["analyze", str(measured_run / "results.jsonl"), "--out", str(tmp_path)]) == 130
    _one_line_error(capsys, "interrupted")


def _edit(**changes):
    def edit(line: str) -> str:
        rec = json.loads(line)
        for key, value in changes.items():
            if value is ...:
                rec.pop(key, None)
            else:
                rec[key] = value
        return json.dumps(rec)  # allow_nan (the default): bare NaN / Infinity, as a foreign writer might

    return edit


@pytest.mark.parametrize("case, edit, message", [
    ("no_stages", _edit(stages=...), "field 'stages': is missing"),
    ("nan_wall", _edit(wall_ms=float("nan")), "not finite (NaN or infinite) at wall_ms"),
    ("inf_overhead", _edit(harness_overhead_ms=float("inf")), "not finite (NaN or infinite) at harness_overhead_ms"),
    ("huge_number", lambda line: line.replace('"wall_ms":', '"wall_ms": 1e999, "x":', 1),
     "not finite (NaN or infinite) at wall_ms"),
    ("no_tokens", _edit(tokens=...), "field 'tokens'"),
    ("zero_wall", _edit(wall_ms=0), "field 'wall_ms': must be positive"),
    ("device_string", _edit(device="cpu"), "field 'device'"),
])
def test_analyze_refuses_bad_records_in_one_line(measured_run, tmp_path, capsys, case, edit, message, monkeypatch):
    path = _copy_results(measured_run, tmp_path / case, edit)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    assert main(["analyze", str(path)]) == 2
    _one_line_error(capsys, str(path), message)
    assert not (path.parent / "summary.json").exists()
    assert not any(temporary.iterdir())  # the temporary report folder, never named, went with the failure


@pytest.mark.parametrize("content", [b"", b"\n\n", b'{"a": 1}\n{"b": 2}\n', b"\x00\xff\xfe\x01binary",
                                     b'{"schema": 2, "x": 1}\n'], ids=["empty", "blank", "foreign", "binary", "schema2"])
def test_analyze_of_a_file_without_schema_1_records_exits_2(tmp_path, capsys, content, monkeypatch):
    path = tmp_path / "results.jsonl"
    path.write_bytes(content)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    assert main(["analyze", str(path)]) == 2
    _one_line_error(capsys, str(path))
    assert not any(temporary.iterdir())


def test_analyze_with_a_corrupt_run_json_beside_the_results(measured_run, tmp_path, capsys):
    path = _copy_results(measured_run, tmp_path / "r")
    for content, message in ((b'{"run_id": "x", "hwspec": ', "is not a run's JSON"), (b"\xff\xfe\x00", "is not"),
                             (b"[1, 2]", "must be a mapping"), (b'{"hwspec": 5}', "field 'hwspec'"),
                             (b'{"measured": {"ceilings": [1]}}', "field 'measured.ceilings'")):
        (path.parent / "run.json").write_bytes(content)
        assert main(["analyze", str(path)]) == 2
        _one_line_error(capsys, "run.json", message)


def test_analyze_out_that_is_a_file_and_a_binary_results_file(measured_run, tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("x")
    assert main(["analyze", str(measured_run / "results.jsonl"), "--out", str(out)]) == 2
    _one_line_error(capsys, "field '--out'")
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\x89PNG\xff\xfe\x00garbage\n" + (measured_run / "results.jsonl").read_bytes())
    assert main(["analyze", str(binary)]) == 2
    _one_line_error(capsys, str(binary), "field 'line 1': line 1 is not valid JSON (not UTF-8 text at byte 0)")


def test_analyze_of_a_run_writes_strict_json(measured_run, tmp_path):
    assert main(["analyze", str(measured_run), "--out", str(tmp_path)]) == 0  # a run directory works too
    summary = _strict_json((tmp_path / "summary.json").read_text())
    report = (tmp_path / "report.txt").read_text()
    assert summary["summary"] and "nan%" not in report and "NaN" not in report
    _strict_json((measured_run / "run.json").read_text())
    for line in (measured_run / "results.jsonl").read_text().splitlines():
        _strict_json(line)


def test_bench_json_is_strict():
    from dohnuts.schema import dumps, json_safe

    value = {"a": float("nan"), "b": [float("inf"), 1.5, (float("-inf"),)], "c": "NaN"}
    assert json.loads(dumps(value)) == {"a": None, "b": [None, 1.5, [None]], "c": "NaN"}
    assert json_safe(2.0) == 2.0 and dumps({"x": 1}) == '{"x": 1}'


# ---------------------------------------------------------------------------------------------
# 4. One-line YAML errors, the workload's hwspec, no empty run directories, the telemetry interval,
#    duplicate keys


@pytest.mark.parametrize("text", ["kind: text\n\tshape: x\n", "kind: text\nshape: {questions: 4\n",
                                  "kind: [text\n", "a: b: c\n", "kind: text\x00\n", "- [\n- ]\n"])
def test_yaml_garbage_is_one_line(tmp_path, capsys, text):
    path = tmp_path / "garbage.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
    _one_line_error(capsys, str(path))


def test_hwspec_yaml_errors_are_one_line(tmp_path):
    from dohnuts.bench.analysis.hwspec import load_hwspec

    bad = tmp_path / "gpu.yaml"
    bad.write_text("name: x\nceilings: {a: [1, 2}\n")
    with pytest.raises(ConfigError, match=r"gpu.yaml: is not valid YAML at line 2") as info:
        load_hwspec(bad)
    assert "\n" not in str(info.value)


def test_a_workloads_hwspec_error_names_the_workload_file(tmp_path, capsys):
    broken = tmp_path / "gpu.yaml"
    broken.write_text("name: [unclosed\n")
    for ref, message in (("no-such-gpu", "neither a file nor a built-in"), (str(broken), "not valid YAML")):
        path = _workload(tmp_path, SMALL + f"hwspec: {ref}\n")
        assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
        _one_line_error(capsys, str(path), "field 'hwspec'", message)
        with pytest.raises(ConfigError, match=r"w.yaml: field 'hwspec'"):
            load_workload(path, *_registry(), gpu=False)
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def foreign_adapter(tmp_path_factory) -> Path:
    """A well-formed adapter of another base: its metadata passes the check made with the workload,
    the target refuses it when it loads the model (the base identity differs)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    import dohnuts.api as api
    from dohnuts.adapters import save_adapter
    from dohnuts.model.lora import LoRAConfig

    path = tmp_path_factory.mktemp("adapter") / "foreign.safetensors"
    save_adapter(api.load("tiny", lora=LoRAConfig(rank=2)), path)
    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    meta["base_identity"] = json.dumps({**json.loads(meta["base_identity"]), "weights": "another-base"})
    save_file(tensors, str(path), metadata=meta)
    return path


def _with_adapter(adapter: Path) -> str:
    return SMALL.replace("targets: [dohnuts]", f"targets: [{{name: dohnuts, options: {{adapter: {adapter}}}}}]")


def test_a_bad_target_option_is_refused_before_anything_is_measured(tmp_path, capsys):
    """Target options are validated with the workload file (the target's `Options`): one line
    naming the file and the field, and no run directory, even after a valid workload."""
    good = _workload(tmp_path, SMALL, "good.yaml")
    for options, field, message in (("{bogus: 1}", "targets[0].options", "unknown dohnuts target option 'bogus'"),
                                     ("{lora_rank: '8'}", "targets[0].options.lora_rank", "expected `int`, got `str`"),
                                     ("{share_prefix: 0}", "targets[0].options.share_prefix", "expected `bool`"),
                                     # a string 'false' was read as true (any non-empty string)
                                     ("{share_prefix: 'false'}", "targets[0].options.share_prefix",
                                      "expected `bool`, got `str`"),
                                     ("{cuda_graphs: 'no'}", "targets[0].options.cuda_graphs", "expected `bool`"),
                                     ("{lora_rank: 100000000}", "targets[0].options.lora_rank",
                                      "must be an integer in 1..1024"),
                                     ("{adapter: /dev/zero}", "targets[0].options",
                                      "/dev/zero: is a character device, not an adapter file"),
                                     ("{adapter: /no/such/adapter.safetensors}", "targets[0].options",
                                      "/no/such/adapter.safetensors: does not exist")):
        bad = _workload(tmp_path, SMALL.replace("targets: [dohnuts]", f"targets: [{{name: dohnuts, options: {options}}}]"),
                        "bad.yaml")
        assert main(["run", str(good), str(bad), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
        _one_line_error(capsys, f"{bad}: field '{field}'", message)
        assert not (tmp_path / "runs").exists()


def test_a_refusal_while_measuring_leaves_no_run_directory(tmp_path, capsys, foreign_adapter):
    """An adapter that cannot be loaded is refused by the target when it is built: the run
    directory created for the run is removed again when nothing was recorded."""
    path = _workload(tmp_path, _with_adapter(foreign_adapter))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, f"{foreign_adapter}: field 'base_identity.weights': belongs to a base with")
    assert not (tmp_path / "runs").exists()
    existing = tmp_path / "kept"
    existing.mkdir()
    assert main(["run", str(path), "--out", str(existing), "--quiet"]) == 2
    assert existing.is_dir() and not list(existing.iterdir())  # the folder stays, empty as it was


def test_a_refusal_after_measurements_keeps_them_and_writes_the_report(tmp_path, capsys, foreign_adapter):
    good = _workload(tmp_path, SMALL, "good.yaml")
    bad = _workload(tmp_path, _with_adapter(foreign_adapter), "bad.yaml")
    assert main(["run", str(good), str(bad), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, f"{foreign_adapter}: field 'base_identity.weights': belongs to a base with")
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = [_strict_json(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert records and {r["workload"]["name"] for r in records} == {"good"}
    assert (run_dir / "report.txt").exists() and _strict_json((run_dir / "summary.json").read_text())["summary"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "0.0000001"])
def test_telemetry_interval_must_be_a_sane_positive_number(tmp_path, capsys, value):
    assert main(["run", str(_workload(tmp_path)), "--telemetry-interval", value, "--out", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, "field '--telemetry-interval'")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text, key, lines", [
    ("kind: text\nrepeat: 3\nkind: image\n", "kind", (1, 3)),
    ("kind: text\nshape:\n  questions: 2\n  questions: 3\n", "questions", (3, 4)),
    ("kind: text\nshape: {questions: 2, questions: 3}\n", "questions", (2, 2)),
])
def test_duplicate_keys_in_a_workload_are_refused(tmp_path, capsys, text, key, lines):
    path = _workload(tmp_path, text)
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
    _one_line_error(capsys, str(path), f"has the key '{key}' twice (line {lines[0]} and line {lines[1]})")


def test_merge_keys_may_still_be_overridden(tmp_path):
    kinds, targets = _registry()
    path = _workload(tmp_path, "kind: text\nshape: &b {questions: 2, requests: 1}\n"
                               "on_gpu:\n  shape:\n    <<: *b\n    questions: 3\n")
    assert load_workload(path, kinds, targets, gpu=True).shape.questions == 3
    assert load_workload(path, kinds, targets, gpu=False).shape.questions == 2


def test_duplicate_keys_in_a_hwspec_are_refused(tmp_path):
    from dohnuts.bench.analysis.hwspec import load_hwspec

    path = tmp_path / "gpu.yaml"
    path.write_text("name: x\nceilings:\n  mm: {kind: compute}\n  mm: {kind: bandwidth}\n")
    with pytest.raises(ConfigError, match=r"gpu.yaml: field 'mm': has the key 'mm' twice \(line 3 and line 4\)"):
        load_hwspec(path)


# ---------------------------------------------------------------------------------------------
# 5. A target that runs out of memory fails alone


@pytest.mark.parametrize("error", [
    lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB"),
    lambda: RuntimeError("HIP error: out of memory"),
], ids=["OutOfMemoryError", "RuntimeError"])
@pytest.mark.slow
def test_an_out_of_memory_target_is_recorded_as_failed_and_the_run_goes_on(tmp_path, monkeypatch, capsys, error):
    from dohnuts.runtime.timing import NULL_TIMER
    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget

    real = DohnutsTarget.run_call

    def run_call(self, call, timer):  # the 'big' workload's target dies on its third timed call
        if call.request.id.startswith("big-") and timer is not NULL_TIMER:  # untimed A/B twins aside
            self.calls_made = getattr(self, "calls_made", 0) + 1
            if self.calls_made == 3:
                raise error()
        return real(self, call, timer)

    monkeypatch.setattr(DohnutsTarget, "run_call", run_call)
    big = _workload(tmp_path, SMALL, "big.yaml")
    after = _workload(tmp_path, SMALL, "after.yaml")
    assert main(["run", str(big), str(after), "--out", str(tmp_path / "runs"), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    warning, error = captured.err.strip().splitlines()  # the failure as it happened, then the one error line
    assert "warning: failed big · dohnuts: out of memory" in warning and "the run goes on" in warning
    assert error.startswith("dohnuts-bench: error:") and "big.yaml" in error and "out of memory" in error
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = [_strict_json(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    big_records = [r for r in records if r["workload"]["name"] == "big"]
    assert [r["iteration"] for r in big_records] == [-1, 0]  # what it completed stays
    assert {r["workload"]["name"] for r in records if r["phase"] == "steady"} == {"big", "after"}
    assert sum(1 for r in records if r["workload"]["name"] == "after" and r["phase"] == "steady") == 2
    (failure,) = _strict_json((run_dir / "run.json").read_text())["failures"]
    assert failure["workload"] == "big" and failure["target"] == "dohnuts" and failure["file"] == str(big)
    assert "out of memory" in failure["error"]
    assert (run_dir / "report.txt").exists() and _strict_json((run_dir / "summary.json").read_text())["summary"]


def test_only_out_of_memory_errors_are_caught():
    from dohnuts.bench.measure.runner import is_out_of_memory

    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_out_of_memory(ValueError("out of memory"))


# ---------------------------------------------------------------------------------------------
# 6. Hostile input, second round (issue 33): a full disk, amplification, caps, the environment


def test_a_full_disk_during_a_run_keeps_every_complete_record(tmp_path, monkeypatch, capsys):
    """The disk fills while a record is written (results.jsonl cannot grow past LIMIT bytes: the write
    that crosses it is cut short, the next one fails, as the kernel does). A record was once cut at
    4096 bytes (a buffered text file flushed in pieces); now the file ends at its last complete
    record, the report covers what was measured, and the run ends with one line, exit 2."""
    import errno
    import os

    import dohnuts.schema.jsonl_file as jsonl_file

    limit = 9000  # about three records
    real_write = os.write

    def write(fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if not name.endswith("results.jsonl"):
            return real_write(fd, data)
        room = limit - os.fstat(fd).st_size
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, bytes(data[:room]))

    monkeypatch.setattr(jsonl_file.os, "write", write)
    path = _workload(tmp_path, SMALL.replace("repeat: 2", "repeat: 6"))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    monkeypatch.undo()
    (run_dir,) = list((tmp_path / "runs").iterdir())
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"dohnuts-bench: error: {run_dir / 'results.jsonl'}: cannot be written (No space left on "
                    "device); the file ends at its last complete record"), last
    data = (run_dir / "results.jsonl").read_bytes()
    assert data.endswith(b"\n") and len(data) <= limit
    records = [_strict_json(line) for line in data.decode().splitlines()]
    assert len(records) >= 2 and all(r["schema"] == 2 for r in records)
    # what was measured before the disk filled is analysed and reported
    assert (run_dir / "report.txt").exists() and _strict_json((run_dir / "summary.json").read_text())["summary"]


def _alias_bomb(levels: int) -> str:
    """Target options of 10**levels strings written in a few hundred bytes of YAML aliases."""
    rows = ["  - &a [xxxx, xxxx, xxxx, xxxx, xxxx, xxxx, xxxx, xxxx, xxxx, xxxx]"] + [
        f"  - &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdef", "bcdefg"[:levels - 1])]
    return "targets:\n  - name: dohnuts\n    options:\n      lora_rank: 8\n      bomb:\n" + \
        "\n".join("    " + r for r in rows) + "\n"


def test_target_options_expanded_by_aliases_are_refused_before_anything_is_written(tmp_path, capsys):
    """A 567-byte workload whose target options held nested aliases wrote a 56.5 MB results file
    (options are copied into every record): options are bounded where the file is read."""
    path = _workload(tmp_path, SMALL.replace("targets: [dohnuts]\n", "") + _alias_bomb(4))
    assert len(path.read_bytes()) < 600
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, f"{path}: field 'targets[0].options': are ", "over the 4096 bytes a record carries")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "store.sqlite").exists()
    path = _workload(tmp_path, SMALL.replace("targets: [dohnuts]\n", "") + _alias_bomb(6))  # 10^6 values
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, str(path), "expands to more than 100,000 values through its aliases")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["abc", "nan", "1.5", "-0.1", "0"])
def test_a_garbled_measurement_variable_is_one_line_before_anything_runs(tmp_path, capsys, monkeypatch, value):
    """DOHNUTS_BENCH_MIN_CLOCK_FRACTION (the validity gate's threshold, the one measurement setting
    read from the environment) set to garbage was a traceback once telemetry started."""
    monkeypatch.setenv("DOHNUTS_BENCH_MIN_CLOCK_FRACTION", value)
    assert main(["run", str(_workload(tmp_path)), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, "environment variable DOHNUTS_BENCH_MIN_CLOCK_FRACTION: must be a number in (0, 1]")
    assert not (tmp_path / "runs").exists()


def test_analyze_caps_what_an_archive_decompresses_to(tmp_path, capsys, monkeypatch):
    """A 1.5 MB results.jsonl.gz once decompressed to 3.4 GB of memory: the archive is read as a
    stream that stops at the results limit, one line naming the file."""
    import gzip

    import dohnuts.bench.analysis.records as records

    bomb = tmp_path / "results.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        for _ in range(64):
            f.write(b" " * (1 << 20))  # 64 MiB of blanks: a few tens of KB compressed
    assert bomb.stat().st_size < 200_000
    monkeypatch.setattr(records, "MAX_RESULTS_BYTES", 8 << 20)
    assert main(["analyze", str(bomb)]) == 2
    _one_line_error(capsys, f"{bomb}: decompresses to more than 8.0 MiB, the limit for a results file")
    assert not (tmp_path / "summary.json").exists()
    damaged = tmp_path / "cut" / "results.jsonl.gz"
    damaged.parent.mkdir()
    damaged.write_bytes(bomb.read_bytes()[:1000])
    assert main(["analyze", str(damaged)]) == 2
    _one_line_error(capsys, str(damaged), "a damaged gzip archive")


@pytest.mark.parametrize("meta, field, why", HOSTILE_ADAPTER_META, ids=HOSTILE_ADAPTER_IDS)
def test_a_hostile_adapter_as_a_target_option_leaves_nothing_behind(tmp_path, capsys, meta, field, why):
    """The bench target's `adapter:` with hostile metadata was a traceback that left a run directory
    with an empty results file: it is checked with the workload, one line naming the adapter's field."""
    bad = hostile_adapter(tmp_path / "bad.safetensors", meta)
    path = _workload(tmp_path, _with_adapter(bad))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _one_line_error(capsys, f"{path}: field 'targets[0].options': dohnuts target option: {bad}: field '{field}': ", why)
    assert not (tmp_path / "runs").exists()


def test_special_files_given_to_gate_report_store_and_history_are_one_line(measured_run, tmp_path, capsys):
    """The commands that read finished runs (gate, report --html, store import, history) take paths
    from a user too: a FIFO (once a hang), a device (once read whole), a directory where a file
    belongs is refused by its type before any read; an output that cannot be a file (/dev/full, a
    FIFO, a name over 255 bytes) is refused before any work, and the device is never replaced."""
    import os
    import shutil
    import stat

    from tests.hostile import LONG_NAME, fifo, no_hang

    run = tmp_path / "run"
    shutil.copytree(measured_run, run)
    with no_hang():
        for args, why in [
            (["gate", "/dev/zero", "--baseline", str(run)], "/dev/zero: is a character device, not a pytest-benchmark"),
            (["gate", str(fifo(tmp_path / "b.json")), "--baseline", str(run)], "b.json: is a FIFO (named pipe)"),
            (["report", str(run), "--html", "--out", "/dev/full"], "field '--out': is a character device"),
            (["report", str(run), "--html", "--out", str(fifo(tmp_path / "p.html"))], "field '--out': is a FIFO"),
            (["report", str(run), "--html", "--out", str(tmp_path / LONG_NAME)], "longer than the file system"),
            (["history", "--store", str(tmp_path / "s.sqlite"), "--json", "/dev/full"], "field '--json': is a "
                                                                                        "character device"),
        ]:
            assert main(args) == 2, args
            _one_line_error(capsys, why)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # never replaced by a file
        other = tmp_path / "other"
        shutil.copytree(run, other)
        (other / "run.json").unlink()
        fifo(other / "run.json")  # the gate reads the run's machine from it: once a hang, now "no machine"
        assert main(["gate", str(other), "--baseline", str(run)]) in (0, 1)
        capsys.readouterr()
        (run / "summary.json").unlink()
        fifo(run / "summary.json")
        assert main(["report", str(run), "--html"]) == 2
        _one_line_error(capsys, f"{run / 'summary.json'}: is a FIFO (named pipe), not a run's JSON")
        (run / "summary.json").unlink()
        (run / "run.json").unlink()
        os.symlink("/dev/zero", run / "run.json")
        assert main(["store", "import", str(run), "--store", str(tmp_path / "s.sqlite")]) == 2
        err = capsys.readouterr().err
        assert f"skipped {run}: {run / 'run.json'}: is a character device, not a run's JSON" in err, err


def test_a_run_keeps_its_milestones_from_the_process_start(measured_run):
    """run.json `measured.timing`: ceilings, then each workload's records, then the end, in order."""
    t = json.loads((measured_run / "run.json").read_text())["measured"]["timing"]
    (w,) = t["workloads"].values()
    assert 0 < t["run_started_s"] <= t["prepared_s"] <= w["first_result_s"] <= w["last_result_s"] <= t["measured_s"]
    report = (measured_run / "report.txt").read_text()
    assert "Time from the process's start: ceilings measured by" in report
    # where the measuring went: the workload's inputs and references, each target's phases, within the run
    (phases,) = w["targets_s"].values()
    assert {"inputs", "references"} <= set(w["spent_s"])
    assert {"build", "first call", "measured calls", "stream and served"} <= set(phases)
    assert 0 < sum(w["spent_s"].values()) + sum(phases.values()) <= t["measured_s"] - t["prepared_s"] + 0.1
    assert "spent on: " in " ".join(report.split())
