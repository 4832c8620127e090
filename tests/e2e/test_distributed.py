"""Several processes on the CPU (gloo): a 2-process update equals a 1-process update on the same 4
microbatches, on both ranks; 2- and 3-process prediction equals 1-process prediction, in order,
bad lines included; a rank killed in the middle of training ends the whole run with one clear
error and leaves the last checkpoint intact."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from dohnuts.cli import main
from dohnuts.train.task import synthetic_requests
from tests.hostile import LONG_NAME
from tests.reference import adapted_tiny, relative_error

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests():
    return synthetic_requests(4, questions=3, shared_prefix=200, seed=21)


def _one_update(world=None):
    from dohnuts.runtime.process_group import SINGLE
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    session = adapted_tiny()
    cfg = OptimConfig(lr=1e-2)
    updater = Updater(session, make_optimizer(session, cfg), RLCDConfig(), cfg, world=world or SINGLE)
    res = updater.update(_requests())
    updater.close()
    return res, torch.cat([p.detach().flatten() for p in session.trainable_parameters()])


def _update_worker(rank: int, size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from dohnuts.runtime.process_group import join, leave

    world, _ = join("cpu")
    res, params = _one_update(world)
    torch.save({"params": params, "loss": res.loss, "grad_norm": res.grad_norm,
                "microbatches": len(res.work.microbatches) if res.work else 0}, f"{out}/rank{rank}.pt")
    leave()


@pytest.mark.slow
@pytest.mark.parametrize("size", [pytest.param(2, marks=pytest.mark.full), 3])
def test_a_distributed_update_equals_one_process(tmp_path, size):
    """The update of N gloo processes (microbatch i on rank i mod N) equals one process's, on every
    rank. The test command runs N = 3, the uneven split (one rank runs two microbatches); N = 2 runs
    in the `full` lane — in the test command two processes' updates are tests/bench/test_launcher.py's
    (test_two_process_train_step_computes_the_one_process_updates: each update's loss on both ranks
    that of one process, update after update)."""
    mp.spawn(_update_worker, args=(size, _free_port(), str(tmp_path)), nprocs=size, join=True)
    torch.set_num_threads(torch.get_num_threads())
    single, params = _one_update()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(size)]
    for r in ranks:
        assert relative_error(r["params"], params) < 1e-6  # FP32: the update is the same update
        assert abs(r["loss"] - single.loss) < 1e-6 and abs(r["grad_norm"] - single.grad_norm) < 1e-5
    assert [r["microbatches"] for r in ranks] == [len(range(k, 4, size)) for k in range(size)]  # i mod size


def _predict(args: list[str], capsys) -> tuple[int, str]:
    """`dohnuts predict ARGS` called in this process (its ranks, with --nproc-per-node, are
    torchrun's processes): the exit status and what it wrote to stderr. The command's own process
    does nothing a test of several processes needs; started anew it would import torch again."""
    capsys.readouterr()
    code = main(["predict", *args])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_distributed_predict_equals_one_process_in_order(tmp_path, capsys):
    reqs = [json.dumps({"id": f"r{i}", "prefix": "context " * (i % 3),
                        "questions": [{"id": "q", "text": f"question {i}?", "candidates": ["yes", "no", "maybe"]}]})
            for i in range(7)]
    reqs.insert(3, "{not json")  # a bad line: reported by the rank that owns it, in its place
    # an image name over NAME_MAX: the rank that owns it reports it as an error record (it once
    # ended that rank with an OSError, and the whole run with 'no output was written')
    reqs.insert(6, json.dumps({"id": "long", "image": LONG_NAME, "questions": [{"text": "q?", "candidates": ["a"]}]}))
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(reqs) + "\n")
    code, err = _predict([str(src), "-o", str(tmp_path / "one.jsonl")], capsys)
    assert code == 2, err
    for n in (2, 3):
        code, err = _predict([str(src), "-o", str(tmp_path / f"n{n}.jsonl"), "--nproc-per-node", str(n)], capsys)
        assert code == 2, err
        a = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (tmp_path / f"n{n}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in a] == [r["id"] for r in b] and len(a) == 9
        for x, y in zip(a, b):
            if "error" in x:
                assert x == y
            else:
                sx = torch.tensor([s for q in x["questions"] for s in q["scores"]])
                sy = torch.tensor([s for q in y["questions"] for s in q["scores"]])
                assert relative_error(sy, sx) < 1e-5
        assert "name longer than the file system allows" in b[6]["error"]
        assert "refused 2" in err and not list(tmp_path.glob("*.part*"))  # shards merged, removed


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_and_the_checkpoint_survives(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--out", str(out), "--updates", "6", "--eval-every", "2",
            "--synthetic-train", "16", "--device", "cpu", "--nproc-per-node", "2"]
    # tests.faulty_cli: the CLI with the fault injected through the trainer's after_update callback,
    # called in this process; torchrun starts its ranks through the same entry (`-m tests.faulty_cli`)
    from tests.faulty_cli import run

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    assert run(["1", "3", *args]) != 0
    stderr = capsys.readouterr().err
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("dohnuts: error:") and "rank 1" in last and "update 2" in last, stderr
    from dohnuts.train.checkpoints import latest_checkpoint

    assert latest_checkpoint(out).name == "update-000002"  # the last good checkpoint, intact
    # resumed at another world size: a checkpoint does not depend on how many processes wrote it
    one_process = args[:-2]  # without "--nproc-per-node 2"
    assert main([*one_process, "--resume"]) == 0, capsys.readouterr().err
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r["kind"] == "update"] == [1, 2, 3, 4, 5, 6]
