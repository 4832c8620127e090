"""`dohnuts train`: the arguments → a checked `TrainConfig` (dohnuts.train.config) and the data
partitions → a `Trainer`, with `--resume` taking the run's own arguments from its checkpoint.

Bad input ends in one line naming the argument or the file and line (exit status 2), before
anything is read or written: a config bound (`--lr: must be positive, got -0.001`), a missing
split file, an unlabelled question (`dev.jsonl:3: field 'questions[0]': training data needs
'answer' or 'rewards' on every question`), a run directory that holds a run without `--resume`.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import msgspec

from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.limits import check_processes
from dohnuts.runtime.requests import read_requests, require_rewards
from dohnuts.schema import check_dir, check_file
from dohnuts.threads import apply_threads
from dohnuts.train.progress import TrainingProgress
from dohnuts.train.run_lock import RunLock
from dohnuts.train.task import synthetic_requests

MAX_SYNTHETIC_TRAIN = 100_000  # synthetic training requests (8 questions each): bounded, as every size is


# `dohnuts train` options a resumed run takes from its checkpoint when they are not given again.
_RESUMED = {"--model": ("model", "model"), "--updates": ("updates", "updates"),
            "--eval-every": ("eval_every", "eval_every"), "--seed": ("seed", "seed"),
            "--lora-rank": ("lora_rank", "lora.rank"), "--lora-alpha": ("lora_alpha", "lora.alpha"),
            "--lr": ("lr", "optim.lr"), "--max-grad-norm": ("max_grad_norm", "optim.max_grad_norm"),
            "--margin-weight": ("margin_weight", "objective.margin_weight"), "--margin": ("margin", "objective.margin"),
            "--initialize-from": ("initialize_from", "initialize_from")}


def _given(argv: list[str], flag: str) -> bool:
    """Whether `flag` was written on the command line (argparse also takes unique abbreviations)."""
    for tok in argv:
        name = tok.split("=", 1)[0]
        if name == flag or (name.startswith("--") and len(name) > 2 and flag.startswith(name)
                            and not any(f != flag and f.startswith(name) for f in (*_RESUMED, "--data",
                                                                                   "--synthetic-train"))):
            return True
    return False


def finished(ckpt: Path, cfg) -> bool:
    """The run's last checkpoint is its final update and its summary (the selection, calibration
    and test) is written: a resume would have nothing to do."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.train.checkpoints import SUMMARY, read_checkpoint

    return read_checkpoint(ckpt).update >= cfg.updates and (Path(cfg.out) / SUMMARY).is_file()


def _resume_defaults(args) -> None:
    """`--resume`: every run argument not written on the command line takes the value the run
    started with (its checkpoint's config), so `dohnuts train --out RUN --resume` continues RUN
    as it was; arguments that are written are checked against it (check_resumable)."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.train.checkpoints import check_run_dir, read_checkpoint

    try:
        ckpt = check_run_dir(args.out, resume=True)
        saved = read_checkpoint(ckpt).config if ckpt is not None else None
    except DohnutsError:
        return  # the checks below report it
    if saved is None:
        return
    argv = getattr(args, "argv", [])
    for flag, (dest, key) in _RESUMED.items():
        if not _given(argv, flag) and key in saved:
            setattr(args, dest, saved[key])
    if not _given(argv, "--data") and not _given(argv, "--synthetic-train"):
        data = str(saved.get("data") or "")
        if data.startswith("synthetic:") and data[len("synthetic:"):].isdigit():
            args.data, args.synthetic_train = None, int(data[len("synthetic:"):])
        elif data:
            args.data = data


def train_command(args, *, launch) -> int:
    """`dohnuts train`: `launch(args, "train", out=...)` starts `--nproc-per-node` processes
    (dohnuts.cli); progress goes to stderr (dohnuts.train.progress)."""
    if args.data:
        _check_data(Path(args.data))  # before torch's import (seconds): a typo is one line at once
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.adapters import read_adapter_meta
    from dohnuts.api import check_device
    from dohnuts.runtime.process_group import launch_world, launched
    from dohnuts.train.checkpoints import check_resumable, check_run_dir, data_fingerprint, read_checkpoint
    from dohnuts.train.config import SPLITS, Partitions, train_config


    check_processes(args.nproc_per_node)
    main_rank = launch_world().is_main  # garbled torchrun variables: one line, before anything
    if args.nproc_per_node > 1 and not launched():
        return launch(args, "train", out=args.out)
    if args.resume:
        _resume_defaults(args)

    # Arguments first (one line naming the argument, exit status 2), before anything is read or written.
    if not 1 <= args.synthetic_train <= MAX_SYNTHETIC_TRAIN:
        raise DohnutsError(f"must be in 1..{MAX_SYNTHETIC_TRAIN}, got {args.synthetic_train!r}",
                           source="--synthetic-train")
    cfg = train_config({
        "model": args.model, "out": args.out, "updates": args.updates, "eval_every": args.eval_every,
        "seed": args.seed, "lora": {"rank": args.lora_rank, "alpha": args.lora_alpha},
        "optim": {"lr": args.lr, "max_grad_norm": args.max_grad_norm},
        "objective": {"margin_weight": args.margin_weight, "margin": args.margin},
        "initialize_from": args.initialize_from, "device": args.device,
        "data": args.data or f"synthetic:{args.synthetic_train}",
    })
    check_device(args.device)
    if args.initialize_from:
        read_adapter_meta(args.initialize_from)  # the file and its metadata, before the run directory is touched
    out = Path(args.out)
    if os.path.lexists(out):
        check_dir(out, error=ConfigError, field="--out", what="a run directory")
    splits = SPLITS
    if args.data:
        root = Path(args.data)
        _check_data(root)  # again: --resume may have named the run's own

    def load_split(path):
        reqs = []
        for n, item in read_requests(path):
            if isinstance(item, DohnutsError):
                raise item
            require_rewards(item, source=f"{path}:{n}")
            reqs.append(item)
        if not reqs:
            raise DohnutsError("holds no requests", source=str(path))
        return reqs

    if args.data:
        data = Partitions(*(load_split(root / f"{split}.jsonl") for split in splits))
    else:
        s = args.seed
        data = Partitions(
            train=synthetic_requests(args.synthetic_train, seed=s * 10 + 1, id_prefix="train"),
            dev=synthetic_requests(20, seed=s * 10 + 2, id_prefix="dev"),
            calib=synthetic_requests(20, seed=s * 10 + 3, id_prefix="calib"),
            test=synthetic_requests(40, seed=s * 10 + 4, id_prefix="test"),
        )
    # One trainer per run directory (rank 0 holds the lock: it alone writes): taken before the run
    # directory is checked, so a second trainer started before the first one's first commit is refused.
    with _run_directory(out, hold=main_rank):
        # A finished or started run is never overwritten; --resume needs something to resume.
        ckpt = check_run_dir(out, resume=args.resume)
        if ckpt is not None:  # changed arguments are refused before the model is loaded
            check_resumable(read_checkpoint(ckpt), cfg, data_fingerprint(data), str(args.out))
            if finished(ckpt, cfg):
                print(f"dohnuts: {args.out} holds a finished run (update {cfg.updates} of {cfg.updates}; the result is "
                      f"in its summary.json): nothing to resume; a larger --updates trains it further", file=sys.stderr)
                return 0
        return _train(args, cfg, data)


SPLIT_FILES = ("train.jsonl", "dev.jsonl", "calib.jsonl", "test.jsonl")  # dohnuts.train.config.SPLITS' files


def _check_data(root: Path) -> None:
    """`--data`: a directory holding the four split files, each a regular file (a FIFO would block,
    a device never end). Imports no torch, so `train_command` checks it before anything heavy."""
    check_dir(root, field="--data", what="a directory of train/dev/calib/test.jsonl")
    for name in SPLIT_FILES:
        if not os.path.lexists(root / name):
            raise DohnutsError(f"does not exist (--data needs {', '.join(SPLIT_FILES)})", source=str(root / name))
        check_file(root / name, what="a JSONL file")


@contextmanager
def _run_directory(out: Path, *, hold: bool):
    """The run directory, created if need be and locked (RunLock) while the body runs; a folder
    this call created and left empty (a refusal before anything was written) is removed again."""
    if not hold:
        yield
        return
    created = not os.path.lexists(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot be created ({exc.strerror or exc})", source=str(out), field="--out") from None
    lock = RunLock(out, log=lambda msg: print(f"dohnuts: {msg}", file=sys.stderr)).acquire()
    try:
        yield
    finally:
        lock.release()
        if created:
            try:
                out.rmdir()  # only when empty: a refusal before anything was written
            except OSError:
                pass


def _train(args, cfg, data) -> int:
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.runtime.collectives import barrier
    from dohnuts.runtime.process_group import join, leave
    from dohnuts.train.trainer import Trainer

    # Several processes (torchrun): every rank has checked the run directory before rank 0 writes.
    world, device = join(args.device)
    apply_threads(args.threads, device)
    cfg = msgspec.structs.replace(cfg, device=device)
    barrier(world)
    log = (lambda msg: print(f"dohnuts: {msg}", file=sys.stderr)) if world.is_main else (lambda msg: None)
    trainer = Trainer(cfg, data, log=log, world=world, after_update=args.after_update)
    try:
        if args.resume and trainer.resume():
            log(f"resumed at update {trainer.update}" + (f" on {world.size} processes" if world.distributed else ""))
        with TrainingProgress(cfg.updates, trainer.update, enabled=world.is_main) as progress:
            trainer.train(progress=progress.update)
        summary = trainer.finish() if world.is_main else None
        barrier(world)  # every rank done before any tears its process group down
    finally:
        trainer.close()
        leave()
    if summary is None:
        return 0
    log(f"selected update {summary['best_update']} (dev accuracy {summary['dev_accuracy']:.3f}); "
        f"temperature {summary['temperature']:.3f}; test accuracy {summary['test_accuracy']:.3f}, "
        f"NLL {summary['test_nll']:.3f}, ECE {summary['test_ece']:.3f} → {Path(cfg.out) / 'summary.json'}")
    return 0
