"""`dohnuts train` never loses or mixes a run: a started run is not overwritten, --resume continues
only with the run's own arguments, a checkpoint is one atomic unit (interrupting its write at any
step resumes consistently and ends equal to an uninterrupted run), the state is stored without
pickle, the log reads as one run in strict JSON, non-finite numbers stop training, and bad
arguments end in one line with exit status 2."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import replace

import pytest
import safetensors.torch
import torch

from dohnuts.adapters import adapter_tensors, read_adapter
from dohnuts.cli import main
from dohnuts.errors import CheckpointError, ConfigError
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.step import Updater
from dohnuts.train.task import synthetic_requests
from dohnuts.schema import dumps
from dohnuts.train.checkpoints import CHECKPOINTS, POINTER, checkpoint_adapter, latest_checkpoint
from dohnuts.train.trainer import Partitions, TrainConfig, Trainer
from tests.hostile import HOSTILE_ADAPTER_IDS, HOSTILE_ADAPTER_META, hostile_adapter


def _data():
    return Partitions(train=synthetic_requests(12, questions=8, seed=1), dev=synthetic_requests(3, questions=2, seed=2),
                      calib=synthetic_requests(3, questions=2, seed=3), test=synthetic_requests(3, questions=2, seed=4))


def _cfg(out, updates, eval_every=2, **kw):
    return TrainConfig(model="tiny", out=str(out), updates=updates, eval_every=eval_every, warmup=2,
                       lora=LoRAConfig(rank=2), **kw)


def _strict_lines(path):
    """The log's records, refusing NaN/Infinity (strict JSON)."""
    def no_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return [json.loads(line, parse_constant=no_constant) for line in path.read_text().splitlines()]


def _updates(log, kind="update"):
    return [r["update"] for r in log if r["kind"] == kind]


def _snapshot(root):
    """{relative path: sha256} of every file under root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _text_data(root, n_train=8):
    root.mkdir(parents=True)
    for split, n, seed in (("train", n_train, 1), ("dev", 2, 2), ("calib", 2, 3), ("test", 2, 4)):
        lines = [json.dumps({"id": r.id, "questions": [
            {"id": q.id, "text": q.text, "candidates": list(q.candidates), "rewards": list(q.rewards)}
            for q in r.questions]})
            for r in synthetic_requests(n, questions=8 if split == "train" else 2, seed=seed, id_prefix=split)]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _common(data):
    return ["train", "--model", "tiny", "--data", str(data), "--eval-every", "2", "--lora-rank", "2",
            "--device", "cpu"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("dohnuts: error:")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished CLI run (2 updates) and its data; tests copy it before touching it."""
    root = tmp_path_factory.mktemp("finished")
    data = _text_data(root / "data")
    assert main([*_common(data), "--out", str(root / "run"), "--updates", "2"]) == 0
    return root


def _copy(finished, tmp_path):
    shutil.copytree(finished / "data", tmp_path / "data")
    shutil.copytree(finished / "run", tmp_path / "run")
    return tmp_path / "data", tmp_path / "run"


# -- 1. a started or finished run is never overwritten ------------------------------------------


@pytest.mark.slow
def test_fresh_start_into_a_finished_run_is_refused(finished, tmp_path, capsys):
    data, run = _copy(finished, tmp_path)
    before = _snapshot(run)
    assert main([*_common(data), "--out", str(run), "--updates", "2"]) == 2
    line = _error_line(capsys)
    assert str(run) in line and "--resume" in line and "new --out" in line
    assert _snapshot(run) == before  # best.safetensors, the log, the summary: untouched


@pytest.mark.slow
def test_fresh_start_into_a_started_run_is_refused(tmp_path, capsys):
    """A run interrupted mid-way (a checkpoint and a log, no summary) is not restarted either."""
    t = Trainer(_cfg(tmp_path / "run", 6), _data(), log=lambda m: None)
    t.train(stop_at=3)
    t.close()
    before = _snapshot(tmp_path / "run")
    with pytest.raises(CheckpointError, match="already holds a training run.*--resume"):
        Trainer(_cfg(tmp_path / "run", 6), _data(), log=lambda m: None).train()
    data = _text_data(tmp_path / "data")
    assert main([*_common(data), "--out", str(tmp_path / "run"), "--updates", "6"]) == 2
    assert "--resume" in _error_line(capsys)
    assert _snapshot(tmp_path / "run") == before


@pytest.mark.slow
def test_resume_with_nothing_to_resume(tmp_path, capsys):
    data = _text_data(tmp_path / "data")
    # A folder holding a log but no committed checkpoint: refused, untouched.
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text('{"kind": "dev", "update": 0}\n')
    assert main([*_common(data), "--out", str(run), "--updates", "2", "--resume"]) == 2
    assert "nothing to resume" in _error_line(capsys)
    assert (run / "train_log.jsonl").read_text() == '{"kind": "dev", "update": 0}\n'
    # An older layout (state.pt + last.safetensors) is refused by name, with or without --resume.
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.pt").write_bytes(b"\x80\x04")
    for extra in ([], ["--resume"]):
        assert main([*_common(data), "--out", str(old), "--updates", "2", *extra]) == 2
        assert "older dohnuts layout" in _error_line(capsys)
    # --resume into a new folder is a fresh start.
    assert main([*_common(data), "--out", str(tmp_path / "new"), "--updates", "2", "--resume"]) == 0
    assert latest_checkpoint(tmp_path / "new").name == "update-000002"


# -- 3. --resume continues only with the run's own arguments -------------------------------------


@pytest.mark.parametrize("arg, value, name", [
    ("--lr", "1e-3", "--lr"), ("--margin", "2", "--margin"), ("--margin-weight", "0.1", "--margin-weight"),
    ("--lora-rank", "4", "--lora-rank"), ("--lora-alpha", "8", "--lora-alpha"), ("--seed", "1", "--seed"),
    ("--eval-every", "1", "--eval-every"), ("--max-grad-norm", "2", "--max-grad-norm"),
    ("--updates", "1", "--updates"),  # below the checkpoint's update
])
def test_resume_refuses_changed_arguments(finished, tmp_path, capsys, arg, value, name):
    data, run = _copy(finished, tmp_path)
    before = _snapshot(run)
    args = [*_common(data), "--out", str(run), "--updates", "2", "--resume"]
    if arg in args:
        args[args.index(arg) + 1] = value
    else:
        args += [arg, value]
    assert main(args) == 2
    line = _error_line(capsys)
    assert f"{name} is " in line and str(run) in line
    assert ("started with" if arg != "--updates" else "already at update 2") in line
    assert _snapshot(run) == before


def test_resume_of_a_finished_run_says_so_and_changes_nothing(finished, tmp_path, capsys):
    """A finished run resumed as it is: one plain line, exit 0, not a word about dropped or
    replayed records, and every file as it was (the selection is not run again)."""
    data, run = _copy(finished, tmp_path)
    before = _snapshot(run)
    assert main(["train", "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"dohnuts: {run} holds a finished run (update 2 of 2" in err and "nothing to resume" in err
    assert "dropped" not in err and "replayed" not in err and err.count("\n") == 1
    assert _snapshot(run) == before


def test_every_file_of_a_run_has_the_same_mode(finished):
    """best.safetensors and the checkpoint's safetensors files get the mode of every other file
    (safetensors alone would create them 0600)."""
    import stat

    from dohnuts.adapters import created_mode

    run = finished / "run"
    modes = {str(p.relative_to(run)): stat.S_IMODE(p.stat().st_mode) for p in run.rglob("*") if p.is_file()}
    assert "best.safetensors" in modes and any(name.endswith("state.safetensors") for name in modes)
    assert set(modes.values()) == {created_mode()}, modes


@pytest.mark.slow
def test_resume_takes_the_run_arguments_not_given_again(finished, tmp_path, capsys):
    """`dohnuts train --out RUN --resume` continues RUN with its own arguments (found on the GPU:
    after a killed rank, the printed advice `continue with --resume` was refused because the
    defaults of the omitted arguments differed from the run's)."""
    data, run = _copy(finished, tmp_path)
    assert main(["train", "--out", str(run), "--resume", "--updates", "4", "--device", "cpu"]) == 0
    log = _strict_lines(run / "train_log.jsonl")
    assert _updates(log) == [1, 2, 3, 4] and _updates(log, "dev") == [0, 2, 4]  # --eval-every 2, as saved
    # an argument that is written is still checked (an abbreviation counts as written)
    assert main(["train", "--out", str(run), "--resume", "--updates", "4", "--eval", "3"]) == 2
    assert "--eval-every is 3" in _error_line(capsys)


@pytest.mark.slow
def test_resume_of_a_synthetic_run_without_its_arguments(tmp_path):
    run = tmp_path / "run"
    base = ["train", "--model", "tiny", "--out", str(run), "--device", "cpu"]
    assert main([*base, "--synthetic-train", "12", "--eval-every", "1", "--updates", "1", "--lora-rank", "2"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--updates", "2"]) == 0
    assert latest_checkpoint(run).name == "update-000002"


def test_resume_refuses_other_data(finished, tmp_path, capsys):
    data, run = _copy(finished, tmp_path)
    before = _snapshot(run)
    other = _text_data(tmp_path / "other", n_train=9)
    assert main([*_common(other), "--out", str(run), "--updates", "2", "--resume"]) == 2
    assert "--data" in _error_line(capsys)
    # Same folder, different content.
    (data / "train.jsonl").write_text("\n".join((data / "train.jsonl").read_text().splitlines()[:-1]) + "\n")
    assert main([*_common(data), "--out", str(run), "--updates", "2", "--resume"]) == 2
    assert "--data: the train requests differ" in _error_line(capsys)
    assert _snapshot(run) == before


@pytest.mark.slow
def test_resume_may_raise_updates_and_keeps_the_schedule(finished, tmp_path, capsys):
    data, run = _copy(finished, tmp_path)
    assert main([*_common(data), "--out", str(run), "--updates", "4", "--resume"]) == 0
    log = _strict_lines(run / "train_log.jsonl")
    assert _updates(log) == [1, 2, 3, 4] and _updates(log, "dev") == [0, 2, 4]
    assert _updates(log, "summary") == [4]  # the first finish's summary record was cut with the log
    assert json.loads((run / "summary.json").read_text())["test_questions"] == 4
    # Trainer level: the learning-rate schedule keeps the span it was laid out for (4 updates);
    # the updates beyond it run at its final rate (0.1 × lr), those before are unchanged.
    t = Trainer(_cfg(tmp_path / "t", 4), _data(), log=lambda m: None)
    t.train()
    t.close()
    first = [r["lr"] for r in _strict_lines(tmp_path / "t" / "train_log.jsonl") if r["kind"] == "update"]
    longer = Trainer(_cfg(tmp_path / "t", 6), _data(), log=lambda m: None)
    assert longer.resume() and longer.update == 4
    longer.train()
    lrs = [r["lr"] for r in _strict_lines(tmp_path / "t" / "train_log.jsonl") if r["kind"] == "update"]
    assert lrs[:4] == first and lrs[4:] == pytest.approx([0.1 * 2e-3] * 2)


# -- 2. non-finite numbers ----------------------------------------------------------------------


@pytest.mark.parametrize("loss, norm", [(float("nan"), 1.0), (0.5, float("inf"))])
@pytest.mark.slow
def test_nonfinite_update_stops_training_and_keeps_the_checkpoint(finished, tmp_path, capsys, monkeypatch, loss,
                                                                   norm):
    data = finished / "data"
    run = tmp_path / "run"
    original = Updater._update
    calls = []

    def poisoned(self, futures, timer):
        res = original(self, futures, timer)
        calls.append(1)
        return replace(res, loss=loss, grad_norm=norm) if len(calls) == 3 else res

    monkeypatch.setattr(Updater, "_update", poisoned)
    assert main([*_common(data), "--out", str(run), "--updates", "4"]) == 2
    line = _error_line(capsys)
    assert "update 3:" in line and "not finite" in line and "update 2" in line
    assert latest_checkpoint(run).name == "update-000002"
    manifest = json.loads((latest_checkpoint(run) / "manifest.json").read_text())
    assert hashlib.sha256((run / "best.safetensors").read_bytes()).hexdigest() == \
        manifest["files"]["best.safetensors"]["sha256"]  # the selection as of update 2
    log = _strict_lines(run / "train_log.jsonl")  # strict JSON: no NaN / Infinity
    err = [r for r in log if r["kind"] == "error"]
    assert len(err) == 1 and err[0]["update"] == 3
    bad = "loss" if math.isnan(loss) else "grad_norm"
    assert err[0][bad] is None and err[0]["nonfinite"] == [bad]
    assert _updates(log) == [1, 2]  # the poisoned update was never counted
    # With the cause gone, --resume continues from update 2; the log reads as one run.
    monkeypatch.setattr(Updater, "_update", original)
    assert main([*_common(data), "--out", str(run), "--updates", "4", "--resume"]) == 0
    log = _strict_lines(run / "train_log.jsonl")
    assert _updates(log) == [1, 2, 3, 4] and not [r for r in log if r["kind"] == "error"]


def test_nonfinite_rewards_never_reach_the_objective(tmp_path):
    data = _data()
    q = Question("q", "which?", ("a", "b"), rewards=(float("nan"), 1.0))
    data.train = [*data.train[:-1], Request(id="bad", questions=(q,))]
    with pytest.raises(ConfigError, match="train request 'bad'.*non-finite reward"):
        Trainer(_cfg(tmp_path / "run", 2), data)
    assert not (tmp_path / "run").exists()


def test_strict_json_names_nonfinite_values():
    line = dumps({"loss": float("nan"), "m": {"nll": float("inf")}, "ok": 1.5}, list_nonfinite=True)
    assert json.loads(line) == {"loss": None, "m": {"nll": None}, "ok": 1.5, "nonfinite": ["loss", "m.nll"]}


# -- 6. argument validation ---------------------------------------------------------------------


@pytest.mark.parametrize("args, name", [
    (["--eval-every", "0"], "--eval-every"), (["--eval-every", "-2"], "--eval-every"),
    (["--synthetic-train", "0"], "--synthetic-train"), (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"),
    (["--lr", "0"], "--lr"), (["--lr=-1e-3"], "--lr"), (["--updates", "-1"], "--updates"),
    (["--max-grad-norm", "0"], "--max-grad-norm"), (["--max-grad-norm", "nan"], "--max-grad-norm"),
    (["--lora-rank", "0"], "--lora-rank"), (["--lora-rank", "-3"], "--lora-rank"),
    (["--margin", "nan"], "--margin"), (["--margin-weight", "inf"], "--margin-weight"),
    (["--lora-alpha", "nan"], "--lora-alpha"),
    (["--data", "MISSING"], "MISSING"),
    # unbounded sizes were a MemoryError (a 25 GB allocation): bounded, refused before anything is built
    (["--synthetic-train", "1000000000"], "--synthetic-train: must be in 1..100000"),
    (["--lora-rank", "100000000"], "--lora-rank: must be an integer in 1..1024"),
    # devices this torch cannot use were tracebacks
    (["--device", "tpu"], "--device tpu: is not a device"), (["--device", "meta"], "--device meta: device type 'meta' is not supported"),
    (["--device", "foo:bar"], "--device foo:bar: is not a device"),
    *([(["--device", "cuda"], "--device cuda: CUDA is not available")] if not torch.cuda.is_available() else []),
    (["--initialize-from", "/dev/zero"], "/dev/zero: is a character device, not an adapter file"),
    (["--out", "/dev/null"], "field '--out': is a character device, not a run directory"),
])
def test_bad_arguments_end_in_one_line(tmp_path, capsys, args, name):
    args = [a.replace("MISSING", str(tmp_path / "missing")) for a in args]
    name = name.replace("MISSING", str(tmp_path / "missing"))
    assert main(["train", "--model", "tiny", "--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dohnuts: error:") and name in err, err
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.parametrize("env, why", [
    ({"WORLD_SIZE": "abc"}, "environment variable WORLD_SIZE: must be an integer ≥ 1, got 'abc'"),
    ({"WORLD_SIZE": "2"}, "environment variable RANK: is not set, but WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "5"}, "environment variable RANK: is 5, but WORLD_SIZE is 2"),
    ({"WORLD_SIZE": "2", "RANK": "x"}, "environment variable RANK: must be an integer ≥ 0, got 'x'"),
])
@pytest.mark.parametrize("command", ["train", "predict"])
def test_garbled_torchrun_variables_end_in_one_line(tmp_path, capsys, monkeypatch, env, why, command):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    src = tmp_path / "r.jsonl"
    src.write_text('{"questions": [{"text": "q?", "candidates": ["a"]}]}\n')
    args = (["train", "--model", "tiny", "--out", str(tmp_path / "run")] if command == "train"
            else ["predict", str(src), "-o", str(tmp_path / "out.jsonl")])
    assert main(args) == 2
    assert why in _error_line(capsys)
    assert not (tmp_path / "run").exists() and not (tmp_path / "out.jsonl").exists()


def test_a_fifo_as_a_split_file_is_named_as_what_it_is(tmp_path, capsys):
    from tests.hostile import no_hang

    data = _text_data(tmp_path / "data")
    (data / "dev.jsonl").unlink()
    os.mkfifo(data / "dev.jsonl")  # once: 'does not exist'; reading it would block
    with no_hang():
        assert main([*_common(data), "--out", str(tmp_path / "run")]) == 2
    assert f"{data / 'dev.jsonl'}: is a FIFO (named pipe), not a JSONL file" in _error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("meta, field, why", HOSTILE_ADAPTER_META, ids=HOSTILE_ADAPTER_IDS)
def test_a_hostile_adapter_to_initialize_from_is_one_line_and_writes_nothing(tmp_path, capsys, meta, field, why):
    bad = hostile_adapter(tmp_path / "bad.safetensors", meta)
    assert main(["train", "--model", "tiny", "--out", str(tmp_path / "run"), "--initialize-from", str(bad)]) == 2
    line = _error_line(capsys)
    assert f"{bad}: field '{field}': " in line and why in line, line
    assert not (tmp_path / "run").exists()


def test_missing_split_file_is_named(tmp_path, capsys):
    data = _text_data(tmp_path / "data")
    (data / "calib.jsonl").unlink()
    assert main([*_common(data), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(data / "calib.jsonl") in err
    (data / "calib.jsonl").write_text("\n")
    assert main([*_common(data), "--out", str(tmp_path / "run")]) == 2
    assert "holds no requests" in _error_line(capsys) and not (tmp_path / "run").exists()


# -- 4, 5, 7. the checkpoint: one directory, no pickle, verified; the log cut back on resume -----


@pytest.mark.slow
def test_checkpoint_layout_without_pickle(tmp_path):
    t = Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None)
    t.train()
    t.close()
    root = tmp_path / "run" / CHECKPOINTS
    assert sorted(p.name for p in root.iterdir()) == [POINTER, "update-000004"]  # the older ones are gone
    ckpt = latest_checkpoint(tmp_path / "run")
    assert sorted(p.name for p in ckpt.iterdir()) == ["adapter.safetensors", "best.safetensors", "manifest.json",
                                                      "state.safetensors"]
    assert not list((tmp_path / "run").glob("*.pt"))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["update"] == 4 and manifest["config"]["optim.lr"] == 2e-3
    state = safetensors.torch.load_file(str(ckpt / "state.safetensors"))
    assert "rng.torch" in state and any(k.endswith(".exp_avg") for k in state)
    # A damaged checkpoint file is refused by name.
    blob = bytearray((ckpt / "state.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (ckpt / "state.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="state.safetensors.*damaged"):
        Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None).resume()
    # A pointer naming a directory that is not there is refused too.
    (root / POINTER).write_text("update-000099\n")
    with pytest.raises(CheckpointError, match="latest"):
        Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None).resume()


@pytest.mark.slow
def test_resume_cuts_the_log_back_to_the_checkpoint(tmp_path):
    t = Trainer(_cfg(tmp_path / "run", 6), _data(), log=lambda m: None)
    t.train(stop_at=3)  # update 3 is logged after the checkpoint of update 2
    t.close()
    assert _updates(_strict_lines(tmp_path / "run" / "train_log.jsonl")) == [1, 2, 3]
    messages = []
    r = Trainer(_cfg(tmp_path / "run", 6), _data(), log=messages.append)
    assert r.resume() and r.update == 2
    assert _updates(_strict_lines(tmp_path / "run" / "train_log.jsonl")) == [1, 2]
    assert any("dropped 1 record written" in m for m in messages)
    r.train()
    log = _strict_lines(tmp_path / "run" / "train_log.jsonl")
    assert _updates(log) == [1, 2, 3, 4, 5, 6] and _updates(log, "dev") == [0, 2, 4, 6]


# -- 8. interrupting a checkpoint write at every step ------------------------------------------


class Crash(Exception):
    """The simulated interruption (not an OSError: nothing may catch and continue)."""


_TARGETS = [(os, "replace"), (os, "rename"), (os, "fsync"), (os, "link"), (os, "mkdir"), (os, "unlink"),
            (os, "rmdir"), (safetensors.torch, "save_file")]


@contextmanager
def _faults(monkeypatch, fail_at: int | None, counter: list):
    """Count the file operations (write, fsync, rename, link, mkdir, delete); raise at number fail_at."""
    with monkeypatch.context() as m:
        for mod, name in _TARGETS:
            fn = getattr(mod, name)

            def wrapped(*a, _fn=fn, _name=name, **k):
                counter.append(_name)
                if len(counter) == fail_at:
                    raise Crash(f"interrupted at {_name} (step {fail_at})")
                return _fn(*a, **k)

            m.setattr(mod, name, wrapped)
        yield


def _optimizer_tensors(trainer):
    return {f"{pid}.{k}": v.clone() for pid, st in trainer.optimizer.state_dict()["state"].items()
            for k, v in st.items()}


def _equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _small_data():
    return Partitions(train=synthetic_requests(8, questions=8, candidates=3, seed=1),
                      dev=synthetic_requests(2, questions=2, candidates=3, seed=2),
                      calib=synthetic_requests(2, questions=1, seed=3), test=synthetic_requests(2, questions=1, seed=4))


def _interruption_points(steps: list[str], every: bool) -> list[int]:
    """The k (1-based) at which to interrupt a checkpoint write of `steps` file operations: every
    k (the `full` lane), or the first and last operation of each kind (save_file, fsync, replace,
    link, mkdir…) and the very first and last — each kind of operation cut before and after the
    others of its kind (the test's size for the test command)."""
    if every:
        return list(range(1, len(steps) + 1))
    points = {1, len(steps)}
    for kind in set(steps):
        at = [k for k, s in enumerate(steps, 1) if s == kind]
        points.update((at[0], at[-1]))
    return sorted(points)


@pytest.mark.slow(seconds=35)
@pytest.mark.parametrize("every", [pytest.param(False, id="each-kind-of-operation"),
                                   pytest.param(True, id="every-operation", marks=pytest.mark.full)])
def test_interrupting_a_checkpoint_at_every_step_resumes_consistently(tmp_path, monkeypatch, every):
    """Checkpoints at updates 0 (before anything else), 1 and 2 (the last). The write of the
    checkpoint of update 2 (and then of the very first one) is interrupted at its k-th file
    operation, for every k (the `full` lane; the test command: each kind of operation at its first
    and last occurrence, _interruption_points); --resume then starts from update 1 or 2 (0 or none for the first),
    with adapters, optimizer, scheduler, best.safetensors and log all of that update, and ends
    with the adapters, selection and log of the uninterrupted run. One update between checkpoints
    is all the claim needs — a checkpoint before the interrupted one, and a run that goes on past
    it; each interruption point trains one update instead of two (the test's CPU time halved)."""
    mid, last = 1, 2  # the checkpoint a resume may fall back to, and the interrupted (last) one
    original = Trainer._save_checkpoint
    reference = {}  # update → (adapters, optimizer tensors, best adapter tensors or None)

    def recording(self):
        original(self)
        best = read_adapter(self.out / "best.safetensors")[0] if self.best["update"] is not None else None
        adapters = {k: v.clone() for k, v in adapter_tensors(self.session).items()}  # (CPU: the live tensors)
        reference[self.update] = (adapters, _optimizer_tensors(self), best)

    def cfg(out):
        return _cfg(out, last, eval_every=1)

    monkeypatch.setattr(Trainer, "_save_checkpoint", recording)
    full = Trainer(cfg(tmp_path / "full"), _small_data(), log=lambda m: None)
    full.train(stop_at=mid)
    shutil.copytree(tmp_path / "full", tmp_path / "base")  # the run as it stands at update `mid`
    full.train()
    full.close()
    final, final_log = checkpoint_adapter(tmp_path / "full")[0], _strict_lines(tmp_path / "full" / "train_log.jsonl")
    assert sorted(reference) == [0, mid, last] and reference[0][2] is None

    def crashing(at_update, fail_at, counter):
        def save(self):
            if self.update != at_update or self.checkpoint == f"update-{at_update:06d}":
                return original(self)
            with _faults(monkeypatch, fail_at, counter):
                original(self)
        return save

    def start(out, at_update):
        """A trainer about to write the checkpoint of `at_update` (`last`: resumed from the copy at `mid`)."""
        if at_update == 0:
            return Trainer(cfg(out), _small_data(), log=lambda m: None)
        shutil.copytree(tmp_path / "base", out)
        t = Trainer(cfg(out), _small_data(), log=lambda m: None)
        assert t.resume() and t.update == mid
        return t

    for at_update in (last, 0):
        steps: list = []
        monkeypatch.setattr(Trainer, "_save_checkpoint", crashing(at_update, None, steps))
        t = start(tmp_path / f"count{at_update}", at_update)
        t.train(stop_at=at_update)
        t.close()
        assert {"save_file", "fsync", "replace", "link" if at_update else "mkdir"} <= set(steps)
        for k in _interruption_points(steps, every):
            out = tmp_path / f"crash{at_update}-{k}"
            seen: list = []
            monkeypatch.setattr(Trainer, "_save_checkpoint", crashing(at_update, k, seen))
            t = start(out, at_update)
            with pytest.raises(Crash):
                t.train()
            t.close()
            where = f"checkpoint of update {at_update}, interrupted at step {k} of {len(steps)} ({seen[-1]})"
            monkeypatch.setattr(Trainer, "_save_checkpoint", original)
            r = Trainer(cfg(out), _small_data(), log=lambda m: None)
            resumed = r.resume()  # the first checkpoint never committed: a fresh start is allowed
            u = r.update
            # The pointer names the checkpoint before (or none) or the new one, never a mix of the two.
            assert u in ((mid, last) if at_update else (0,)) and (resumed or at_update == 0), where
            if resumed:
                adapters, optim, best = reference[u]
                _equal(adapter_tensors(r.session), adapters)
                _equal(_optimizer_tensors(r), optim)
                assert r.scheduler.last_epoch == u, where
                log = _strict_lines(out / "train_log.jsonl") if (out / "train_log.jsonl").exists() else []
                assert _updates(log) == list(range(1, u + 1)), where
                assert _updates(log, "dev") == ([] if best is None else list(range(0, u + 1))), where
                if best is not None:
                    _equal(read_adapter(out / "best.safetensors")[0], best)
            r.train(stop_at=mid if at_update == 0 else None)
            r.close()
            end = mid if at_update == 0 else last
            _equal(checkpoint_adapter(out)[0], reference[end][0])
            _equal(read_adapter(out / "best.safetensors")[0], reference[end][2])
            log = _strict_lines(out / "train_log.jsonl")
            assert _updates(log) == _updates(final_log)[:end], where
            assert _updates(log, "dev") == list(range(0, end + 1)), where
            assert sorted(p.name for p in (out / CHECKPOINTS).iterdir()) == [POINTER, f"update-{end:06d}"], where
    _equal(reference[last][0], final)


# -- 8. one trainer per run directory ---------------------------------------------------------------

_HOLD_LOCK = ("import sys, time\nfrom dohnuts.train.run_lock import RunLock\nRunLock(sys.argv[1]).acquire()\n"
              "print('locked', flush=True)\ntime.sleep(600)\n")


def _hold_lock(out):
    """Another process holding the run directory's lock (as a trainer does), until it is killed."""
    import subprocess
    import sys

    from tests.hostile import ROOT

    out.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_second_trainer_is_refused_naming_the_holder(tmp_path, capsys):
    import socket

    out = tmp_path / "run"
    holder = _hold_lock(out)
    try:
        before = _snapshot(out)
        assert main(["train", "--model", "tiny", "--out", str(out), "--updates", "2"]) == 2
        line = _error_line(capsys)
        assert f"{out}: the run is in use by another trainer: PID {holder.pid} on host {socket.gethostname()}" in line
        assert _snapshot(out) == before  # nothing written, nothing taken
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_killed_trainer_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    holder = _hold_lock(out)
    holder.kill()  # SIGKILL: the lock file stays behind, naming a process that is gone
    holder.wait()
    assert json.loads((out / "train.lock").read_text())["pid"] == holder.pid
    data = _text_data(tmp_path / "data")
    assert main([*_common(data), "--out", str(out), "--updates", "2"]) == 0
    err = capsys.readouterr().err
    assert f"took over the stale lock of PID {holder.pid} on host" in err and "is no longer running" in err
    assert not (out / "train.lock").exists()  # released at exit
    assert _updates(_strict_lines(out / "train_log.jsonl")) == [1, 2]


@pytest.mark.slow
def test_two_trainers_started_together_on_one_out(tmp_path):
    """The issue's case: the second trainer starts while the first is before its first commit. Once
    both exited 0 and the log held both runs' records; now the second is refused, the first is whole."""
    import subprocess
    import sys
    import time

    data = _text_data(tmp_path / "data")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [*_common(data), "--out", str(out), "--updates", "4"]
    # The second trainer is started first and waits, imports done, for the word to go.
    second = subprocess.Popen([sys.executable, "-c", "import sys, dohnuts.cli, dohnuts.api, dohnuts.train.trainer\n"
                               "print('ready', flush=True); sys.stdin.readline()\n"
                               f"sys.exit(dohnuts.cli.main({args!r}))"],
                              cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert second.stdout.readline().strip() == "ready"
    first = subprocess.Popen([sys.executable, "-m", "dohnuts", *args], cwd=tmp_path, env=env,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "train.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    _, second_err = second.communicate("go\n", timeout=300)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert second.returncode == 2 and "in use by another trainer: PID" in second_err, second_err
    assert _updates(_strict_lines(out / "train_log.jsonl")) == [1, 2, 3, 4]  # one run, once


@pytest.mark.parametrize("resume", [False, True])
def test_a_read_only_out_is_one_line(finished, tmp_path, capsys, monkeypatch, resume):
    import dohnuts.train.run_lock as run_lock

    data, run = _copy(finished, tmp_path)
    out = run if resume else tmp_path / "ro" / "new"
    if not resume:
        out.parent.mkdir()
    if os.geteuid() != 0:  # root writes anywhere: the refusal of a read-only folder is simulated
        os.chmod(out if resume else out.parent, 0o555)
    else:
        real_open, real_mkdir = os.open, type(out).mkdir

        def read_only(path, *args, **kw):
            if str(path).startswith(str(out if resume else out.parent)) and os.path.basename(str(path)) == "train.lock":
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args, **kw)

        def no_mkdir(self, *args, **kw):
            if str(self).startswith(str(out.parent)) and not resume:
                raise PermissionError(13, "Permission denied")
            return real_mkdir(self, *args, **kw)

        monkeypatch.setattr(run_lock.os, "open", read_only)
        monkeypatch.setattr(type(out), "mkdir", no_mkdir)
    try:
        assert main([*_common(data), "--out", str(out), "--updates", "2", *(["--resume"] if resume else [])]) == 2
    finally:
        monkeypatch.undo()
        os.chmod(out if resume else out.parent, 0o755)
    line = _error_line(capsys)
    assert "Permission denied" in line and str(out) in line


# -- 9. a full disk, a cut log line, a hostile manifest ------------------------------------------------

def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_resumes(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError (once a traceback: only OSError
    was caught); the partial checkpoint directory is removed and the committed one resumes."""
    import safetensors.torch
    from safetensors import SafetensorError

    real = safetensors.torch.save_file
    calls = []

    def full_disk(tensors, path, metadata=None):
        calls.append(path)
        if "update-000002" in path:
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    t = Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None)
    with pytest.raises(CheckpointError) as info:
        t.train()
    t.close()
    text = str(info.value)
    assert "update 2: the checkpoint cannot be written (No space left on device" in text and "\n" not in text
    assert "the checkpoint update-000000 is intact" in text
    assert sorted(p.name for p in (tmp_path / "run" / CHECKPOINTS).iterdir()) == [POINTER, "update-000000"]
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    r = Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None)
    assert r.resume() and r.update == 0
    r.train()
    r.close()
    assert _updates(_strict_lines(tmp_path / "run" / "train_log.jsonl")) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_full_disk_during_training_end_to_end(tmp_path):
    """A real short write (the process cannot grow a file past 40 KB: the checkpoint's state does not
    fit) ends in one line, exit 2, and leaves the run resumable elsewhere."""
    from tests.hostile import run_with_full_disk

    data = _text_data(tmp_path / "data")
    out = tmp_path / "run"
    p = run_with_full_disk(["-m", "dohnuts", *_common(data), "--out", str(out), "--updates", "2"], 40_000,
                           cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("dohnuts: error:") and "cannot be written (File too large" in last, p.stderr
    for line in (out / "train_log.jsonl").read_bytes().splitlines(keepends=True) if (out / "train_log.jsonl").exists() \
            else []:
        assert line.endswith(b"\n") and json.loads(line)


@pytest.mark.slow
def test_resume_after_a_cut_log_line_says_what_it_dropped(tmp_path):
    t = Trainer(_cfg(tmp_path / "run", 4), _data(), log=lambda m: None)
    t.train(stop_at=2)
    t.close()
    with open(tmp_path / "run" / "train_log.jsonl", "ab") as f:
        f.write(b'{"kind": "update", "upd')  # a record cut by a crash mid-write
    messages = []
    r = Trainer(_cfg(tmp_path / "run", 4), _data(), log=messages.append)
    assert r.resume() and r.update == 2
    assert any("dropped a cut last line (23 bytes without its end)" in m for m in messages), messages
    assert _updates(_strict_lines(tmp_path / "run" / "train_log.jsonl")) == [1, 2]


def test_a_log_that_is_a_fifo_or_a_device_at_resume_is_one_line(finished, tmp_path, capsys):
    """--resume reads train_log.jsonl whole: a FIFO in its place once blocked forever, /dev/zero
    grew without bound. Both are refused by their type, and the run is left as it was."""
    from tests.hostile import fifo, no_hang

    data, run = _copy(finished, tmp_path)
    (run / "train_log.jsonl").unlink()
    for make, why in ((lambda p: fifo(p), "is a FIFO (named pipe), not a training log"),
                      (lambda p: os.symlink("/dev/zero", p), "is a character device, not a training log")):
        make(run / "train_log.jsonl")
        with no_hang():
            assert main([*_common(data), "--out", str(run), "--updates", "3", "--resume"]) == 2
        assert f"{run / 'train_log.jsonl'}: {why}" in _error_line(capsys)
        assert not (run / "train_log.jsonl").is_file()
        (run / "train_log.jsonl").unlink()


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A run stopped at update 2 (a committed checkpoint with a selection)."""
    root = tmp_path_factory.mktemp("checkpointed")
    t = Trainer(_cfg(root / "run", 4), _data(), log=lambda m: None)
    t.train(stop_at=2)
    t.close()
    return root / "run"


HOSTILE_MANIFESTS = {
    "update-negative": (lambda m: m.update(update=-7), "field 'update': must be >= 0, got -7"),
    "best-nan": (lambda m: m["best"].update(accuracy=float("nan")), "field 'best.accuracy': must be a finite number"),
    "best-after": (lambda m: m["best"].update(update=99), "field 'best.update': is update 99, after"),
    "best-missing": (lambda m: m.pop("best"), "field 'best': is missing"),
    "time-inf": (lambda m: m.update(time=float("inf")), "field 'time': must be a finite number"),
    "file-outside": (lambda m: m["files"].update({"../../x": m["files"]["state.safetensors"]}), "field 'files"),
    "rng-short": (lambda m: m["python_rng"][1].pop(), "field 'python_rng[1]': must hold at least 625"),
    "rng-word": (lambda m: m["python_rng"][1].__setitem__(5, -1), "field 'python_rng[1][5]': must be >= 0"),
    "lr-nan": (lambda m: m["optimizer"]["param_groups"][0].update(lr=float("nan")),
               "field 'optimizer.param_groups[0].lr': must be a finite number"),
    "last-epoch": (lambda m: m["scheduler"].update(last_epoch="x"), "field 'scheduler.last_epoch': must be an integer"),
    "log-size": (lambda m: m["log"].update(bytes=-1), "field 'log.bytes': must be >= 0"),
    "sha": (lambda m: m["data"].update(train="zz"), "field 'data.train': must match"),
    # found by tests/model/test_fuzz_checkpoint_readers.py: a traceback at resume (random.setstate) and
    # one at the first update after it (the scheduler zips its rates with the optimizer's groups)
    "rng-position": (lambda m: m["python_rng"][1].__setitem__(624, 700),
                     "field 'python_rng[1][624]': must be <= 624 (the generator's position in its state), got 700"),
    "no-base-lrs": (lambda m: m["scheduler"].update(base_lrs=[]), "field 'scheduler.base_lrs': is empty"),
    "two-base-lrs": (lambda m: m["scheduler"].update(base_lrs=[1e-3, 1e-3], _last_lr=[1e-3, 1e-3]),
                     "field 'scheduler.base_lrs': holds 2 rates for the optimizer's 1 parameter group(s)"),
    "last-lr": (lambda m: m["scheduler"].update(_last_lr=[]), "field 'scheduler._last_lr': holds 0 rates for 1"),
}


def test_a_manifests_hyper_parameters_other_than_the_rate_are_the_runs_own(checkpointed, tmp_path):
    """A hand-edited optimizer group (`eps: [17972, true]`, found by the fuzz suite) once reached
    AdamW's step as a traceback: resume reads only the rates the schedule reached; every other
    hyper-parameter comes from the run's configuration, which resume compares."""
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    mpath = latest_checkpoint(run) / "manifest.json"
    manifest = json.loads(mpath.read_text())
    group = manifest["optimizer"]["param_groups"][0]
    want = dict(group)
    group.update(eps=[17972, True], betas="x", weight_decay=None, foreach="yes")
    mpath.write_text(json.dumps(manifest))
    t = Trainer(_cfg(run, 4), _data(), log=lambda m: None)
    assert t.resume() and t.update == 2
    g = t.optimizer.param_groups[0]
    assert (g["eps"], tuple(g["betas"]), g["weight_decay"], g["lr"]) == \
        (want["eps"], tuple(want["betas"]), want["weight_decay"], want["lr"])
    t.train()
    t.close()
    assert _updates(_strict_lines(run / "train_log.jsonl")) == [1, 2, 3, 4]


@pytest.mark.parametrize("case", list(HOSTILE_MANIFESTS))
def test_a_hostile_manifest_is_refused_naming_the_field(checkpointed, tmp_path, case):
    edit, why = HOSTILE_MANIFESTS[case]
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    mpath = latest_checkpoint(run) / "manifest.json"
    manifest = json.loads(mpath.read_text())
    edit(manifest)
    mpath.write_text(json.dumps(manifest))  # json.dumps writes NaN / Infinity as they come
    with pytest.raises(CheckpointError) as info:
        Trainer(_cfg(run, 4), _data(), log=lambda m: None).resume()
    text = str(info.value)
    assert text.startswith(f"{mpath}: ") and why in text and "\n" not in text, text


def test_the_interruption_points_cover_each_kind_of_operation_first_and_last():
    steps = ["mkdir", "save_file", "fsync", "save_file", "fsync", "replace", "fsync", "link"]
    assert _interruption_points(steps, every=True) == list(range(1, 9))
    assert _interruption_points(steps, every=False) == [1, 2, 3, 4, 6, 7, 8]
