"""One execution policy (dohnuts.runtime.policy), exactly as the specification states it: no
environment variable, flag or public argument switches it; sharing is a rule, never a stopwatch;
and what training selects is what prediction serves."""

from __future__ import annotations

import pytest

import ast
import inspect
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

import dohnuts.api as api
from dohnuts.model.scorer import FULL, SHARED, choose_pass
from dohnuts.runtime.policy import EAGER, PRODUCT, UNSHARED, ExecutionPolicy
from dohnuts.train.task import synthetic_requests

ROOT = Path(__file__).resolve().parents[2]
POLICY_PACKAGES = ("model", "ops", "runtime", "train")
# torchrun's own variables, read by the one process-group module
TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
PROCESS_GROUP_MODULE = Path("dohnuts/runtime/process_group.py")


def _environment_reads(path: Path) -> list[tuple[int, str | None]]:
    """(line, key or None) of every read of the process environment in a module: os.environ (any
    use), os.getenv, `from os import environ`. The key when the read names it with a string
    literal (os.environ["K"], os.environ.get("K"), os.getenv("K")), each read on its own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def literal(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in ("environ", "getenv", "environb", "getenvb") for a in node.names):
            found.append((node.lineno, None))
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                and node.attr in ("environ", "getenv", "environb", "getenvb")):
            continue
        up, key = parent.get(node), None
        if node.attr.startswith("getenv") and isinstance(up, ast.Call) and up.args:
            key = literal(up.args[0])  # os.getenv("K")
        elif isinstance(up, ast.Subscript):
            key = literal(up.slice)  # os.environ["K"]
        elif isinstance(up, ast.Attribute) and up.attr == "get" and isinstance(parent.get(up), ast.Call) \
                and parent[up].args:
            key = literal(parent[up].args[0])  # os.environ.get("K")
        found.append((node.lineno, key))
    return sorted(found, key=lambda t: t[0])


def test_no_environment_reads_in_the_runtime():
    """The model, the ops, the runtime and training read no environment variable — but torchrun's
    RANK / WORLD_SIZE / LOCAL_RANK in the process-group module."""
    offenders = []
    for pkg in POLICY_PACKAGES:
        for path in sorted((ROOT / "dohnuts" / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            for line, key in _environment_reads(path):
                if rel == PROCESS_GROUP_MODULE and key in TORCHRUN:
                    continue
                offenders.append(f"{rel}:{line} ({key or 'os.environ'})")
    assert not offenders, offenders


def test_the_environment_reader_finds_reads(tmp_path):
    """The check above can fail: it finds each form of read in a planted module."""
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom os import environ\na = os.environ.get('X')\nb = os.getenv('Y')\n"
                 "c = os.environ['RANK']\nd = dict(os.environ)\ne = (os.environ['RANK'], os.environ.get('Z'))\n")
    assert [k for _, k in _environment_reads(f)] == [None, "X", "Y", "RANK", None, "RANK", "Z"]


# Spellings of switches the policy does not have (or no longer has): none may be documented.
SWITCHES = ("DOHNUTS_", "--no-share-prefix", "cuda_graphs", "share_prefix", "checkpoint_layers", "ops.reference",
            "_policy", "ShareTuner")


def test_the_readme_documents_no_runtime_switch():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not [s for s in SWITCHES if s in readme]


def test_no_public_argument_switches_the_policy():
    """`dohnuts.load`, the session, the predictor and the training loop take no argument that picks
    a backend, graphs, streams or sharing; the only way to another policy is the private `_policy`."""
    from dohnuts.runtime.predict import Predictor
    from dohnuts.runtime.session import Session
    from dohnuts.train.step import OptimConfig, Updater

    banned = re.compile(r"share|graph|stream|backend|fused|reference|overlap|checkpoint|policy|pass")
    for fn in (api.load, Session.__init__, Session.prepare, Session.predict, Predictor.__init__, Updater.__init__):
        public = [n for n in inspect.signature(fn).parameters if not n.startswith("_")]
        assert not [n for n in public if banned.search(n)], (fn.__qualname__, public)
    assert "_policy" in inspect.signature(api.load).parameters
    assert not [f for f in OptimConfig.__struct_fields__ if banned.search(f)]
    # the ops package exports no switch either: the reference paths' switch is private to the
    # parity tooling (dohnuts.ops._dispatch.reference)
    import dohnuts.ops

    assert not [n for n in dir(dohnuts.ops) if not n.startswith("_") and n in ("reference", "fused", "backend")]
    assert not [n for n in dohnuts.ops.__all__ if n in ("reference", "fused", "backend")]


def test_the_cli_has_no_policy_flag():
    from dohnuts.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    flags = [opt for p in sub.choices.values() for a in p._actions for opt in a.option_strings]
    assert flags and not [f for f in flags if re.search(r"share|graph|stream|backend|fused|checkpoint|overlap", f)]


def test_policy_variants_are_named():
    assert PRODUCT.variant is None and ExecutionPolicy() == PRODUCT
    assert UNSHARED.variant == "unshared" and EAGER.variant == "eager"
    assert ExecutionPolicy(share_prefix=False, cuda_graphs=False).variant == "unshared+eager"
    assert api.load("tiny").policy == PRODUCT


CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time")


def _paths(session, reqs) -> list[tuple[int, str]]:
    hbs = [session.prepare(r) for r in reqs]
    with torch.inference_mode():
        for hb in hbs:
            session.score(hb, hb.tensors)
    return [(hb.plan.prefix_len, choose_pass(hb.tensors.score_inputs())) for hb in hbs]


REQUESTS = (synthetic_requests(2, questions=5, shared_prefix=300, seed=1)
            + synthetic_requests(1, questions=5, seed=2)
            + synthetic_requests(1, questions=2, shared_prefix=100, seed=3))  # 2 × 111 shared: 64 saved, too few


def test_two_fresh_sessions_choose_the_same_path_without_reading_a_clock(monkeypatch):
    """Every clock of `time` raises on the scoring path (prepare, score): nothing is timed to choose
    a pass, and two fresh sessions choose the same paths."""
    def no_clock(*args):
        raise AssertionError("a clock was read on the scoring path")

    paths = []
    for _ in range(2):
        session = api.load("tiny")
        with monkeypatch.context() as m:
            for name in CLOCKS:
                m.setattr(time, name, no_clock)
            paths.append(_paths(session, REQUESTS))
    assert paths[0] == paths[1]
    assert [p for _, p in paths[0]] == [SHARED, SHARED, FULL, FULL] and paths[0][0][0] == 256


@pytest.mark.slow
def test_another_process_chooses_the_same_paths():
    """The rule depends on the tokens alone: a new interpreter (another string-hash seed) plans the
    same splits."""
    code = ("import json; import dohnuts.api as api; from tests.runtime.test_policy import REQUESTS; "
            "s = api.load('tiny'); print(json.dumps([s.prepare(r).plan.prefix_len for r in REQUESTS]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    here = [api.load("tiny").prepare(r).plan.prefix_len for r in REQUESTS]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


@pytest.mark.slow
def test_the_policy_selected_in_training_is_the_policy_served(tmp_path):
    """The trainer's development accuracy and NLL of the selected checkpoint (scored in training's
    session, adapters unmerged) equal those of `dohnuts predict --adapter best.safetensors` (merged,
    deployment) on the same partition: to the last question, and the NLL to FP32 rounding."""
    from dohnuts.cli import main
    from dohnuts.train.calibration import nll
    from dohnuts.train.trainer import Partitions, TrainConfig, Trainer, question_logits

    data = Partitions(train=synthetic_requests(24, questions=4, shared_prefix=200, seed=11, id_prefix="t"),
                      dev=synthetic_requests(6, questions=4, shared_prefix=200, seed=12, id_prefix="d"),
                      calib=synthetic_requests(4, questions=4, seed=13, id_prefix="c"),
                      test=synthetic_requests(4, questions=4, seed=14, id_prefix="e"))
    out = tmp_path / "run"
    trainer = Trainer(TrainConfig(model="tiny", out=str(out), updates=6, eval_every=3), data,
                      log=lambda m: None)
    try:
        trainer.train()
    finally:
        trainer.close()
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    best = trainer.best["update"]
    dev = [r for r in log if r["kind"] == "dev" and r["update"] == best][-1]
    assert trainer.session.prepare(data.dev[0]).plan.prefix_len > 0  # the shared pass, in both

    requests = tmp_path / "dev.jsonl"
    requests.write_text("".join(json.dumps({"id": r.id, "prefix": r.prefix, "questions": [
        {"id": q.id, "text": q.text, "candidates": list(q.candidates), "rewards": list(q.rewards)}
        for q in r.questions]}) + "\n" for r in data.dev))
    served = tmp_path / "served.jsonl"
    assert main(["predict", str(requests), "-o", str(served), "--adapter", str(out / "best.safetensors")]) == 0
    rows = [json.loads(x) for x in served.read_text().splitlines()]

    class Served:  # the served records in the shape question_logits reads
        def __init__(self, row):
            self.questions = [type("Q", (), {"scores": q["scores"]}) for q in row["questions"]]

    logits, correct = question_logits([Served(r) for r in rows], data.dev)
    accuracy = float((logits.argmax(-1) == correct).double().mean())
    assert accuracy == dev["accuracy"]
    assert abs(nll(logits, correct, 1.0) - dev["nll"]) <= 1e-5 * max(1.0, abs(dev["nll"]))


@pytest.mark.slow
def test_python_dash_m_dohnuts_is_the_command(tmp_path):
    """`python -m dohnuts` runs the `dohnuts` command (torchrun starts its workers that way)."""
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"id": "r1", "questions": [{"id": "q", "text": "which?", "candidates": ["a", "b"]}]})
                   + "\n")
    out = subprocess.run([sys.executable, "-m", "dohnuts", "predict", str(src), "-o", str(tmp_path / "o.jsonl")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert row["id"] == "r1" and len(row["questions"][0]["scores"]) == 2
    from dohnuts.launch import launch

    assert inspect.signature(launch).parameters["entry"].default == ("-m", "dohnuts")
