"""A typo in a path or a workload key is reported before torch is imported: `dohnuts-bench run`
(workload files), `dohnuts predict` (the request file) and `dohnuts train` (`--data`).

Torch's import takes seconds (18–30 s on a busy 2-core machine); a misspelt file name or field must
not wait for it. Each case runs the CLI's `main` in a fresh interpreter and asserts, in that
interpreter, that the one-line error came and that `torch` is not in `sys.modules` — which no
other import order can satisfy. The early workload check must also agree with the full one
(`load_workload`) and pass every workload file the repository holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dohnuts.bench.measure.workload import check_workload_file, load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# A CLI's `main` in a fresh interpreter: its exit status, and whether torch was imported on the way.
PROBE = """
import contextlib, importlib, io, json, sys
main = importlib.import_module(sys.argv[1]).main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main(sys.argv[2:])
print(json.dumps({"rc": rc, "stderr": err.getvalue(), "torch": "torch" in sys.modules}))
"""


def _run_cli(args: list[str], cwd: Path, module: str = "dohnuts.bench.cli") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # a hang guard only: the command takes about a second
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


BAD_FILES = {
    "unknown-key": ("kind: text\nrepeats: 3\n", "field 'repeats': unknown field"),
    "unknown-shape-key": ("kind: text\nshape: {questons: 3}\n", "field 'shape.questons': unknown field"),
    "unknown-gpu-key": ("kind: text\non_gpu: {shape: {seq_tokns: 64}}\n", "field 'on_gpu.shape.seq_tokns'"),
    "unknown-kind": ("kind: txt\n", "field 'kind': unknown workload kind 'txt'"),
    "unknown-target": ("kind: text\ntargets: [dohnut]\n", "field 'targets[0].name': unknown target 'dohnut'"),
    "not-yaml": ("kind: [text\n", "bad.yaml"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_workload_file_is_one_line_before_torch(case, tmp_path):
    text, expected = BAD_FILES[case]
    (tmp_path / "bad.yaml").write_text(text)
    out = _run_cli(["run", "bad.yaml", "--out", "runs"], tmp_path)
    lines = out["stderr"].strip().splitlines()
    assert out["rc"] == 2 and len(lines) == 1, out
    assert lines[0].startswith("dohnuts-bench: error: bad.yaml") and expected in lines[0], lines
    assert out["torch"] is False, "torch was imported before the workload file was refused"
    assert not (tmp_path / "runs").exists()  # no run directory either


def test_a_missing_workload_file_is_one_line_before_torch(tmp_path):
    (tmp_path / "good.yaml").write_text("kind: text\n")
    out = _run_cli(["run", "good.yaml", "missing.yaml"], tmp_path)
    assert out["rc"] == 2 and out["stderr"].strip() == "dohnuts-bench: error: missing.yaml: does not exist", out
    assert out["torch"] is False


def test_a_good_file_goes_on_to_the_checks_that_need_torch(tmp_path):
    """The converse: a file the early check passes reaches the full validation, which imports torch
    (here it refuses a sequence over the tiny model's context, a check that needs the model)."""
    (tmp_path / "long.yaml").write_text("kind: text\nshape: {seq_tokens: 30000}\n")
    out = _run_cli(["run", "long.yaml"], tmp_path)
    assert out["rc"] == 2 and "field 'shape.seq_tokens'" in out["stderr"] and "context" in out["stderr"], out
    assert out["torch"] is True


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_the_early_check_says_what_the_full_one_says(case, tmp_path):
    """The same file, the same one-line error, whichever check meets it first."""
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_FILES[case][0])
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    with pytest.raises(ConfigError) as early:
        check_workload_file(path, kinds, targets)
    with pytest.raises(ConfigError) as full:
        load_workload(path, kinds, targets, gpu=False)
    assert str(early.value) == str(full.value)


def test_every_workload_file_of_the_repository_passes_the_early_check_without_torch():
    """The early check loads nothing heavy for a good file either (the plugins included), so a valid
    run pays for torch once, after it."""
    files = sorted(str(p) for p in (ROOT / "workloads").rglob("*.yaml"))
    assert len(files) >= 10
    probe = (
        "import sys\n"
        "from dohnuts.bench.plugins import collect, plugin_manager\n"
        "from dohnuts.bench.measure.workload import check_workload_file\n"
        "pm = plugin_manager()\n"
        "k, t = collect(pm, 'dohnuts_bench_register_workload_kinds'), collect(pm, 'dohnuts_bench_register_targets')\n"
        "for f in sys.argv[1:]:\n"
        "    check_workload_file(f, k, t)\n"
        "print('torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", probe, *files], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_dohnuts_predict_refuses_a_missing_request_file_before_torch(tmp_path):
    out = _run_cli(["predict", "--model", "tiny", "requets.jsonl", "-o", "out.jsonl"], tmp_path, "dohnuts.cli")
    assert out["rc"] == 2 and out["stderr"].strip() == "dohnuts: error: requets.jsonl: does not exist", out
    assert out["torch"] is False
    assert not (tmp_path / "out.jsonl").exists()


def test_dohnuts_train_refuses_missing_data_before_torch(tmp_path):
    out = _run_cli(["train", "--data", "dat/digits", "--out", "runs/x"], tmp_path, "dohnuts.cli")
    assert out["rc"] == 2 and out["stderr"].strip() == "dohnuts: error: dat/digits: field '--data': does not exist"
    assert out["torch"] is False
    (tmp_path / "data").mkdir()
    for name in ("train", "dev", "calib"):
        (tmp_path / "data" / f"{name}.jsonl").write_text("")
    out = _run_cli(["train", "--data", "data", "--out", "runs/x"], tmp_path, "dohnuts.cli")
    assert out["rc"] == 2 and out["stderr"].strip().startswith("dohnuts: error: data/test.jsonl: does not exist")
    assert out["torch"] is False
    assert not (tmp_path / "runs").exists()


def test_the_early_data_check_names_the_splits_training_reads():
    from dohnuts.train.command import SPLIT_FILES
    from dohnuts.train.config import SPLITS

    assert SPLIT_FILES == tuple(f"{s}.jsonl" for s in SPLITS)
