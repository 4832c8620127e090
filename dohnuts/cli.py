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
import sys
from pathlib import Path

from dohnuts.errors import DohnutsError


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    transient=False, disable=not sys.stderr.isatty())


def cmd_predict(args) -> int:
    import dohnuts.api as api
    from dohnuts.runtime.predict import Predictor, RequestFailure
    from dohnuts.runtime.requests import read_requests

    src = Path(args.requests)
    if not src.exists():
        raise DohnutsError("does not exist", source=str(src))
    total = sum(1 for line in src.open(encoding="utf-8") if line.strip())
    model = api.load(args.model, adapter=args.adapter, device=args.device)
    if args.adapter:
        # Deployment merges (the seed): the adapters are folded into the base, no adapter cost.
        n = model.merge_lora()
        print(f"dohnuts: merged {n} LoRA adapters of {args.adapter} into the base weights for prediction "
              f"(temperature {model.temperature:.3f})", file=sys.stderr)
    predictor = Predictor(model, share_prefix=not args.no_share_prefix)
    refused = 0
    out = open(args.output, "w", encoding="utf-8") if args.output != "-" else sys.stdout
    try:
        items = ((f"{src}:{n}", item) for n, item in read_requests(src))
        with _progress() as bar:
            task = bar.add_task("scoring", total=total)
            for result in predictor.run(items):
                if isinstance(result, RequestFailure):
                    refused += 1
                    print(f"dohnuts: {result.error}", file=sys.stderr)
                out.write(result.to_json() + "\n")
                out.flush()
                bar.advance(task)
    finally:
        predictor.close()
        if out is not sys.stdout:
            out.close()
    print(f"dohnuts: scored {total - refused} of {total} requests"
          + (f", refused {refused} (see the error records)" if refused else ""), file=sys.stderr)
    return 2 if refused else 0


def cmd_train(args) -> int:
    from dohnuts.model.lora import LoRAConfig
    from dohnuts.runtime.requests import read_requests
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig
    from dohnuts.train.task import synthetic_requests
    from dohnuts.train.trainer import Partitions, TrainConfig, Trainer

    def load_split(path):
        reqs = []
        for n, item in read_requests(path):
            if isinstance(item, DohnutsError):
                raise item
            if any(q.rewards is None for q in item.questions):
                raise DohnutsError("training data needs 'answer' or 'rewards' on every question",
                                   source=f"{path}:{n}", field="questions")
            reqs.append(item)
        return reqs

    if args.data:
        root = Path(args.data)
        data = Partitions(*(load_split(root / f"{s}.jsonl") for s in ("train", "dev", "calib", "test")))
    else:
        s = args.seed
        data = Partitions(
            train=synthetic_requests(args.synthetic_train, seed=s * 10 + 1, id_prefix="train"),
            dev=synthetic_requests(20, seed=s * 10 + 2, id_prefix="dev"),
            calib=synthetic_requests(20, seed=s * 10 + 3, id_prefix="calib"),
            test=synthetic_requests(40, seed=s * 10 + 4, id_prefix="test"),
        )
    cfg = TrainConfig(
        model=args.model, out=args.out, updates=args.updates, eval_every=args.eval_every, seed=args.seed,
        lora=LoRAConfig(rank=args.lora_rank, alpha=args.lora_alpha),
        optim=OptimConfig(lr=args.lr, max_grad_norm=args.max_grad_norm),
        objective=RLCDConfig(margin_weight=args.margin_weight, margin=args.margin),
        initialize_from=args.initialize_from, device=args.device,
    )
    log = lambda msg: print(f"dohnuts: {msg}", file=sys.stderr)  # noqa: E731
    trainer = Trainer(cfg, data, log=log)
    try:
        if args.resume and trainer.resume():
            log(f"resumed at update {trainer.update}")
        with _progress() as bar:
            task = bar.add_task("training", total=cfg.updates, completed=trainer.update)
            trainer.train(progress=lambda u, loss: bar.update(task, completed=u, description=f"loss {loss:.3f}"))
        summary = trainer.finish()
    finally:
        trainer.close()
    log(f"selected update {summary['best_update']} (dev accuracy {summary['dev_accuracy']:.3f}); "
        f"temperature {summary['temperature']:.3f}; test accuracy {summary['test_accuracy']:.3f}, "
        f"NLL {summary['test_nll']:.3f}, ECE {summary['test_ece']:.3f} → {Path(cfg.out) / 'summary.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dohnuts", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("predict", help="score the candidates of every request in a JSONL file")
    pr.add_argument("requests", help="JSONL file, one request per line (see README 'Requests')")
    pr.add_argument("-o", "--output", default="-", help="output JSONL (default: stdout)")
    pr.add_argument("--model", default="tiny", help="preset name or checkpoint directory (default: tiny)")
    pr.add_argument("--adapter", help="adapter file (LoRA + head + temperature) saved by `dohnuts train`; its "
                    "adapters are merged into the base weights before scoring (deployment)")
    pr.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    pr.add_argument("--no-share-prefix", action="store_true", help="never compute a shared prefix once")
    pr.set_defaults(func=cmd_predict)

    tr = sub.add_parser("train", help="train LoRA adapters + head with RLCD")
    tr.add_argument("--model", default="tiny")
    tr.add_argument("--out", default="runs/train", help="run directory (adapters, state, logs)")
    tr.add_argument("--data", help="folder with train/dev/calib/test.jsonl (default: the synthetic task)")
    tr.add_argument("--synthetic-train", type=int, default=200, help="synthetic training requests")
    tr.add_argument("--updates", type=int, default=200)
    tr.add_argument("--eval-every", type=int, default=25)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--max-grad-norm", type=float, default=1.0)
    tr.add_argument("--lora-rank", type=int, default=8)
    tr.add_argument("--lora-alpha", type=float, default=16.0)
    tr.add_argument("--margin-weight", type=float, default=0.5, help="RLCD λ")
    tr.add_argument("--margin", type=float, default=1.0, help="RLCD m")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--initialize-from", help="start from a verified adapter file instead of fresh adapters")
    tr.add_argument("--resume", action="store_true", help="continue the run in --out from its last state")
    tr.add_argument("--device")
    tr.set_defaults(func=cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DohnutsError as exc:
        print(f"dohnuts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dohnuts: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
