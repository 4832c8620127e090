"""`dohnuts`: predict with a scoring model, or train one.

    dohnuts predict --model tiny requests.jsonl -o out.jsonl
    dohnuts train --model tiny --out runs/tiny [--updates 200] [--resume] [--initialize-from A]

Bad input ends with one line naming the file and field (exit status 2). In `predict`, a bad
request line is reported with its line number and written to the output as an error record;
the other lines are still scored, every result is flushed as soon as it exists, and the exit
status is 2 if any line was refused (0 otherwise).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dohnuts import __version__
from dohnuts.errors import CheckpointError, DohnutsError
from dohnuts.limits import MAX_PROCESSES_PER_NODE, MAX_SEED, check_processes
from dohnuts.runtime.requests import count_requests, read_requests
from dohnuts.schema import JsonlFile, check_file, check_output_file, printable, write_text_atomic
from dohnuts.threads import apply_threads, check_threads
from dohnuts.train.command import train_command


def _progress(enabled: bool = True):
    """`predict`'s bar in a terminal: the time left labelled, estimated from the mean pace over the
    last hour rather than rich's last 30 s, so that it does not jump with each request."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("left"),
                    TimeRemainingColumn(), transient=False, speed_estimate_period=3600.0,
                    disable=not (enabled and sys.stderr.isatty()))


def _launch(args, command: str, out: str | None = None) -> int:
    """`--nproc-per-node N`: the same command as N processes under torchrun; one line when a rank fails."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.launch import launch

    argv, skip = [], False
    for a in args.argv:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            argv.append(a)
    res = launch(argv, args.nproc_per_node, entry=args.entry)
    if res.failed_rank is None:
        return res.returncode
    if res.exitcode == 2:
        return 2  # a user error: the rank has said what it was, in one line
    status = f"exit status {res.exitcode}" if res.exitcode is not None and res.exitcode >= 0 else \
        f"signal {-(res.exitcode or 0)}"
    after = ""
    if command == "train" and out:
        # imports torch: only once the command line's checks have passed (they run before torch)
        from dohnuts.train.checkpoints import latest_checkpoint

        ckpt = latest_checkpoint(out)
        after = (f"; the run's last checkpoint, update {int(ckpt.name[7:])}, is intact (continue with --resume)"
                 if ckpt is not None else "; no checkpoint was committed")
    elif command == "predict":
        after = "; no output was written"
    print(f"dohnuts: error: rank {res.failed_rank} of {args.nproc_per_node} ended with {status}; torchrun stopped "
          f"the other ranks{after}", file=sys.stderr)
    return 1


def _predict_paths(args) -> tuple[Path, Path | None]:
    """The input and the output (None: stdout) of `predict`, checked before anything is loaded or
    written: the input a regular file or a pipe, the output new or a regular file (never a device,
    a FIFO or a directory) that is not the input (same file through any path, symlink or hard
    link: opening it for writing would truncate the requests before they are read), the adapter
    a regular file within its size limit."""
    src = Path(args.requests)
    check_file(src, what="a JSONL file", streams=True)
    if args.adapter:
        # imports torch: only once the command line's checks have passed (they run before torch)
        from dohnuts.adapters import MAX_ADAPTER_BYTES

        check_file(args.adapter, max_bytes=MAX_ADAPTER_BYTES, error=CheckpointError, field="--adapter",
                   what="an adapter file")
    if args.output == "-":
        try:
            same = os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(src))
        except (OSError, ValueError, AttributeError):  # stdout captured or closed: not a file
            same = False
        if same:
            raise DohnutsError("standard output is redirected to this input file; the results would overwrite "
                               "or follow the requests (use -o with another file)", source=str(src))
        return src, None
    # the one output rule (dohnuts.schema.output_paths): not a symbolic link, not the requests or the
    # adapter (by any path), not in a benchmark run folder, new or a regular file
    out = check_output_file(args.output, inputs=[src, args.adapter], field="-o",
                            what="a JSONL file to write (-o - writes to standard output)")
    return src, out


def _predict_device(spec: str | None) -> str | None:
    """`--device` checked before the model is built (dohnuts.api.check_device)."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.api import check_device

    return check_device(spec)


class _Stdout:
    """Standard output as a record writer: one line written and flushed per record."""

    @staticmethod
    def write_line(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


def _open_output(out: Path | None):
    """The results' writer: a JsonlFile (each record one whole write; a full disk leaves the file
    valid up to its last complete record), or standard output."""
    return _Stdout() if out is None else JsonlFile(out, truncate=True)


def _failure_line(src: Path, failure) -> str:
    """A refused line's message on stderr, always `file:line: ...` (an image error names the image)."""
    if failure.line is None:
        return failure.error
    where = f"{src}:{failure.line}"
    return failure.error if failure.error.startswith(where + ":") else f"{where}: {failure.error}"


def _quiet_stdout() -> None:
    """After the reader of stdout went away (`dohnuts predict r.jsonl | head -1`): point stdout's
    file descriptor at /dev/null, so that the interpreter's final flush of sys.stdout cannot raise
    BrokenPipeError again (the recipe of the Python docs, signal module, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def cmd_predict(args) -> int:
    check_processes(args.nproc_per_node)
    # The paths before torch's import (seconds on a busy machine): a typo is one line at once; with
    # --nproc-per-node, once, before N processes start.
    src, out_path = _predict_paths(args)
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.runtime.process_group import launched

    if args.nproc_per_node > 1 and not launched():
        _predict_device(args.device)
        return _launch(args, "predict")
    if launched():
        return _predict_sharded(args)
    # imports torch: only once the command line's checks have passed (they run before torch)
    import dohnuts.api as api
    from dohnuts.runtime.predict import Predictor, RequestFailure

    device = _predict_device(args.device)
    apply_threads(args.threads, device)
    total = count_requests(src) if src.is_file() else None  # a pipe (/dev/stdin) can be read once only
    model = api.load(args.model, adapter=args.adapter, device=device)
    if args.adapter:
        # Deployment merges (the seed): the adapters are folded into the base, no adapter cost.
        n = model.merge_lora()
        print(f"dohnuts: merged {n} LoRA adapters of {args.adapter} into the base weights for prediction "
              f"(temperature {model.temperature:.3f})", file=sys.stderr)
    out = _open_output(out_path)
    predictor = Predictor(model)
    done = refused = 0
    try:
        items = ((f"{src}:{n}", item) for n, item in read_requests(src))
        with _progress() as bar:
            task = bar.add_task("scoring", total=total)
            for result in predictor.run(items):
                if isinstance(result, RequestFailure):
                    refused += 1
                    print(f"dohnuts: {_failure_line(src, result)}", file=sys.stderr)
                try:
                    out.write_line(result.to_json())
                except BrokenPipeError:
                    raise  # main(): the reader of stdout has gone (`| head`), stop quietly
                except OSError as exc:
                    raise DohnutsError(f"cannot be written ({exc.strerror or exc}); the {done} records before "
                                       "are kept", source=str(out_path or "<stdout>")) from None
                except DohnutsError as exc:  # the JsonlFile cut its partial line back
                    raise DohnutsError(f"{exc.message}; {done} records written", source=exc.source) from None
                done += 1
                bar.advance(task)
    finally:
        predictor.close()
        try:
            out.close()
        except OSError:
            pass  # every complete record was written already; the error above says what failed
    print(f"dohnuts: scored {done - refused} of {done} requests"
          + (f", refused {refused} (see the error records)" if refused else ""), file=sys.stderr)
    return 2 if refused else 0


def _predict_sharded(args) -> int:
    """One rank of `predict` under torchrun: request k (bad lines included) is scored by rank
    k mod N; rank 0 gathers every rank's records and writes them in input order."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    import torch.distributed as dist

    # imports torch: only once the command line's checks have passed (they run before torch)
    import dohnuts.api as api
    from dohnuts.launch import report_status
    from dohnuts.runtime.predict import Predictor, RequestFailure
    from dohnuts.runtime.process_group import join, leave


    src, out_path = _predict_paths(args)
    world, device = join(_predict_device(args.device))
    apply_threads(args.threads, device)
    try:
        model = api.load(args.model, adapter=args.adapter, device=device)
        if args.adapter:
            model.merge_lora()
        mine = [(k, (f"{src}:{n}", item)) for k, (n, item) in enumerate(read_requests(src))
                if k % world.size == world.rank]
        predictor = Predictor(model)
        try:
            rows = [(k, r.to_json(), _failure_line(src, r) if isinstance(r, RequestFailure) else None)
                    for (k, _), r in zip(mine, predictor.run(item for _, item in mine))]
        finally:
            predictor.close()
        gathered = [None] * world.size if world.is_main else None
        dist.gather_object(rows, gathered, dst=0)
        # Every rank past the gather before any tears its group down: a rank leaving while the root
        # still receives was seen to abort another rank at exit (gloo, 3 processes, once in CI).
        dist.barrier()
    finally:
        leave()
    if not world.is_main:
        return report_status(world, 0)
    rows = sorted((r for part in gathered for r in part), key=lambda r: r[0])
    refused = sum(1 for _, _, f in rows if f)
    for _, _, failure in rows:
        if failure:
            print(f"dohnuts: {failure}", file=sys.stderr)
    text = "".join(line + "\n" for _, line, _ in rows)
    if out_path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:  # all at once: a temporary file renamed over the output (a full disk leaves the old one)

        write_text_atomic(out_path, text)
    print(f"dohnuts: scored {len(rows) - refused} of {len(rows)} requests on {world.size} processes"
          + (f", refused {refused} (see the error records)" if refused else ""), file=sys.stderr)
    return report_status(world, 2 if refused else 0)


def cmd_train(args) -> int:
    """`dohnuts train` (dohnuts/train/command.py), with this module's launcher."""
    return train_command(args, launch=_launch)


def _how_to_resume(args) -> str:
    """After Ctrl-C in `dohnuts train`: where the run stands and the exact command that continues
    it (its other arguments come from the checkpoint; the machine settings given are repeated).
    "" for another command, or in a rank under torchrun (the command that started it says it)."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.runtime.process_group import launched

    if args.command != "train" or launched():
        return ""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.train.checkpoints import latest_checkpoint

    try:
        ckpt = latest_checkpoint(args.out)
    except DohnutsError as exc:
        return f"; the run's checkpoint cannot be read ({exc})"
    if ckpt is None:
        return "; no checkpoint was committed: nothing to resume, run the command again"
    command = ["dohnuts", "train", "--out", args.out, "--resume"]
    for flag, value in (("--device", args.device), ("--threads", args.threads),
                        ("--nproc-per-node", args.nproc_per_node if args.nproc_per_node != 1 else None)):
        if value is not None:
            command += [flag, str(value)]
    return (f"; the checkpoint of update {int(ckpt.name[7:])} is intact — continue with: "
            f"{printable(shlex.join(command))}")


THREADS_HELP = ("torch's CPU threads for this process (default: 1 on a CPU, which keeps a run steady on a machine "
                "that other processes share — torch's own default, one a core, stalled updates for seconds there: "
                "docs/measurement.md, 'A CPU run'; a GPU run keeps torch's default)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dohnuts", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"dohnuts {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("predict", help="score the candidates of every request in a JSONL file",
                        epilog="exit status: 0 every line scored; 2 bad input, or some lines refused (their error "
                        "records are in the output); 141 (128 + SIGPIPE, as a process killed by SIGPIPE) when "
                        "the reader of stdout closed it early, e.g. `dohnuts predict r.jsonl | head -1`: the "
                        "run stops quietly, without a traceback")
    pr.add_argument("requests", help="JSONL file, one request per line (see README 'Requests')")
    pr.add_argument("-o", "--output", default="-", help="output JSONL (default: stdout)")
    pr.add_argument("--model", default="tiny", help="preset name or checkpoint directory (default: tiny)")
    pr.add_argument("--adapter", help="adapter file (LoRA + head + temperature) saved by `dohnuts train`; its "
                    "adapters are merged into the base weights before scoring (deployment; default: none, the base model)")
    pr.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    pr.add_argument("--threads", type=int, help=THREADS_HELP)
    pr.add_argument("--nproc-per-node", type=int, default=1,
                    help=f"score on N processes (1 to {MAX_PROCESSES_PER_NODE}: one per GPU; gloo processes on a CPU) under "
                    "torchrun; request k goes to rank k mod N and the output keeps the input order (default 1)")
    pr.set_defaults(func=cmd_predict)

    tr = sub.add_parser("train", help="train LoRA adapters + head with RLCD")
    tr.add_argument("--model", default="tiny", help="preset name (tiny, qwen3.5-0.8b/2b/4b/9b: seeded random "
                    "weights) or a Qwen3.5 checkpoint directory (default: tiny)")
    tr.add_argument("--out", default="runs/train", help="run directory (adapters, state, logs; default: runs/train)")
    tr.add_argument("--data", help="folder with train/dev/calib/test.jsonl (default: the synthetic task)")
    tr.add_argument("--synthetic-train", type=int, default=200,
                    help="synthetic training requests, when no --data (default: 200)")
    tr.add_argument("--updates", type=int, default=200,
                    help="optimizer updates, each 4 microbatches at one parameter snapshot (default: 200)")
    tr.add_argument("--eval-every", type=int, default=25,
                    help="updates between evaluations on dev, which select best.safetensors (default: 25)")
    tr.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (default: 2e-3)")
    tr.add_argument("--max-grad-norm", type=float, default=1.0,
                    help="gradients clipped to this global norm each update (default: 1.0)")
    tr.add_argument("--lora-rank", type=int, default=8, help="rank of the LoRA adapters (default: 8)")
    tr.add_argument("--lora-alpha", type=float, default=16.0,
                    help="LoRA scale numerator: an adapter's update is scaled by alpha / rank (default: 16.0)")
    tr.add_argument("--margin-weight", type=float, default=0.5, help="RLCD λ, the margin term's weight (default: 0.5)")
    tr.add_argument("--margin", type=float, default=1.0, help="RLCD m, the margin (default: 1.0)")
    tr.add_argument("--seed", type=int, default=0,
                    help=f"seed of the adapters' initialisation, the data order and the synthetic task (0 to "
                    f"{MAX_SEED}: what every generator takes as it is) (default: 0)")
    tr.add_argument("--initialize-from", help="start from a verified adapter file instead of fresh adapters "
                    "(default: fresh adapters)")
    tr.add_argument("--resume", action="store_true",  # (arguments not given again: the run's own)
                    help="continue the run in --out from its last committed checkpoint, with the arguments it "
                    "started with (only --updates, to train longer, and --device may change); without it, an --out "
                    "that holds a run is refused (default: off)")
    tr.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    tr.add_argument("--threads", type=int, help=THREADS_HELP)
    tr.add_argument("--nproc-per-node", type=int, default=1,
                    help=f"data-parallel training on N processes (1 to {MAX_PROCESSES_PER_NODE}: one per GPU; gloo processes on a "
                    "CPU) under torchrun: microbatch i of every update runs on rank i mod N, gradients are "
                    "all-reduced, rank 0 evaluates and writes (default 1; `torchrun -m dohnuts.cli train ...` does "
                    "the same)")
    tr.set_defaults(func=cmd_train)
    return p


def main(argv: list[str] | None = None, *, after_update=None, entry: tuple[str, ...] = ("-m", "dohnuts")) -> int:
    """The `dohnuts` command. For tests only: `after_update(world, update)` is called by training
    after each update (fault injection), and `entry` is how `--nproc-per-node` starts the workers
    (an entry that injects the same fault into them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv, args.after_update, args.entry = argv, after_update, entry
    try:
        if args.threads is not None:  # a machine setting, never stored with a run (--resume may change it)
            check_threads(args.threads)  # applied where the device is known (dohnuts.threads.apply_threads)
        return args.func(args)
    except DohnutsError as exc:
        print(f"dohnuts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dohnuts: interrupted{_how_to_resume(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout closed it (`dohnuts predict r.jsonl | head -1`): stop without a
        # traceback and exit as a process killed by SIGPIPE reads in a shell (128 + 13), so that
        # `set -o pipefail` still sees the output was cut short. Python ignores SIGPIPE; the docs
        # advise against restoring SIG_DFL, and redirect stdout to devnull instead (_quiet_stdout).
        _quiet_stdout()
        return 141


if __name__ == "__main__":
    sys.exit(main())
