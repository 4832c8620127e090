"""The training lifecycle: initialise, train, select, merge, calibrate, test — and resume.

    base init, or --initialize-from ADAPTER (verified unmerged LoRA + head weights)
    checkpoint of update 0 (before anything else is written: every started run can be resumed)
    step 0: development score of the starting weights (an eligible selected checkpoint)
    updates of 4 microbatches (RLCD, AdamW over LoRA + head; a microbatch is one request, or several
        when the requests hold few questions: an update averages ≈ 32 questions, step.py), dev
        evaluation every N updates,
        the best dev accuracy selects `best.safetensors` (ties keep the earlier one),
        a checkpoint after every evaluation (what --resume restores: adapters, optimizer,
        scheduler, RNG states, update count, selection so far, the length of the log)
    after the last update: load `best`, merge LoRA, fit the temperature on the calibration
        partition, evaluate the test partition (accuracy, NLL, ECE) — test never selects or tunes.

Both starts run the identical data order, objective, schedule, selection and evaluation. The
data order is a pure function of (seed, update), so a resumed run sees the same microbatches.
Everything is recorded in `train_log.jsonl` (loss, grad norm, lr, dev quality, RSS, GPU memory);
it is strict JSON: a non-finite number is written as null and named in the record's `nonfinite`.

The run directory, its checkpoints and what `--resume` may change: dohnuts/train/checkpoints.py.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import shutil
import time
from pathlib import Path

import msgspec
import psutil
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import dohnuts.api as api
from dohnuts.adapters import fsync_dir, fsync_file, load_adapter, save_adapter, save_safetensors
from dohnuts.errors import CheckpointError, ConfigError, DohnutsError
from dohnuts.runtime.predict import RequestResult
from dohnuts.runtime.process_group import SINGLE, World
from dohnuts.schema import GIB, append_line, dumps, read_file, short
from dohnuts.train.calibration import expected_calibration_error, fit_temperature, nll
from dohnuts.train.checkpoints import (
    BEST, CHECKPOINT_FORMAT, CHECKPOINTS, LOG, POINTER, SUMMARY, check_resumable, check_run_dir, config_record,
    data_fingerprint, optimizer_state, optimizer_tensors, prune_checkpoints, read_checkpoint, scheduler_state,
    sha256_of, write_atomic, write_durable,
)
from dohnuts.train.config import Partitions, TrainConfig, validate_config, validate_data
from dohnuts.train.step import MICROBATCHES, Updater, make_optimizer, requests_per_microbatch

__all__ = ["Partitions", "TrainConfig", "Trainer", "TrainingError", "evaluate", "microbatch_order"]

MAX_LOG_BYTES = 4 * GIB  # train_log.jsonl read at resume: a few hundred bytes an update


class TrainingError(DohnutsError):
    """Training cannot go on (a non-finite loss or gradient norm); what was saved stays intact."""


def question_logits(results: list[RequestResult], requests) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, Kmax) raw scores with −inf padding and (Q,) index of the best-rewarded candidate."""
    rows, correct = [], []
    for res, req in zip(results, requests):
        for qr, q in zip(res.questions, req.questions):
            rows.append(qr.scores)
            correct.append(max(range(len(q.rewards)), key=lambda i: q.rewards[i]))
    kmax = max(len(r) for r in rows)
    logits = torch.full((len(rows), kmax), float("-inf"), dtype=torch.float64)
    for i, r in enumerate(rows):
        logits[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
    return logits, torch.tensor(correct)


def evaluate(model, requests) -> dict:
    logits, correct = question_logits(model.predict(requests), requests)
    acc = float((logits.argmax(-1) == correct).double().mean())
    return {"accuracy": acc, "nll": nll(logits, correct, model.temperature), "questions": len(correct)}


def _schedule(cfg: TrainConfig):
    span = cfg.schedule_updates if cfg.schedule_updates is not None else cfg.updates

    def factor(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, span - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def microbatch_order(n: int, seed: int, update: int, per: int = 1) -> list[int]:
    """Indices of the 4 · per training requests of `update` (epoch-wise permutations of range(n)),
    microbatch i being the i-th run of `per` of them."""
    out = []
    for j in range(MICROBATCHES * per):
        k = update * MICROBATCHES * per + j
        epoch, pos = divmod(k, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(perm[pos])
    return out


class Trainer:
    """The lifecycle of one run. With several processes (`world`, dohnuts.runtime.process_group) every
    rank trains its share of each update and restores the same checkpoint; rank 0 alone evaluates,
    selects, writes checkpoints and logs, and finishes (calibration and test)."""

    def __init__(self, cfg: TrainConfig, data: Partitions, log=print, world: World = SINGLE, after_update=None):
        """`after_update(world, update)`, when given, is called after each update (tests inject
        faults through it)."""
        validate_config(cfg)
        validate_data(data)
        self.cfg, self.data, self.log, self.world = cfg, data, log, world
        self.after_update = after_update
        self.out = Path(cfg.out)
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError("exists and is not a directory", source=str(self.out))
        self.out.mkdir(parents=True, exist_ok=True)
        self.fingerprint = data_fingerprint(data)
        self.session = api.load(cfg.model, lora=None if cfg.initialize_from else cfg.lora, device=cfg.device,
                              seed=cfg.seed)
        if cfg.initialize_from:
            load_adapter(self.session, cfg.initialize_from)  # verifies the base identity
        self.optimizer = make_optimizer(self.session, cfg.optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(cfg))
        self.update = 0
        self.best = {"update": None, "accuracy": -1.0}
        self.checkpoint: str | None = None  # the committed checkpoint this trainer continues from / wrote last
        self.per = requests_per_microbatch(data.train)  # a function of the data, which --resume verifies
        if self.per > 1:
            log(f"the training requests hold {sum(len(r.questions) for r in data.train) / len(data.train):.3g} "
                f"question(s) on average: an update takes {MICROBATCHES} microbatches of {self.per} requests")
        self.updater = Updater(self.session, self.optimizer, cfg.objective, cfg.optim, world=world,
                               requests_per_microbatch=self.per)

    def close(self) -> None:
        self.updater.close()

    # -- persistence --------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        """Write the state of `self.update` as a new checkpoint directory, then commit it."""
        root = self.out / CHECKPOINTS
        name = f"update-{self.update:06d}"
        if name == self.checkpoint:
            return
        adapters = {k: v for k, v in self.session.model.named_parameters() if v.requires_grad}
        opt_tensors, opt_meta = optimizer_tensors(self.optimizer.state_dict())
        for key, t in [*adapters.items(), *opt_tensors.items()]:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise TrainingError(f"update {self.update}: {key} holds non-finite values; not checkpointed (the "
                                    f"checkpoint {self.checkpoint} is intact)", source=str(self.out))
        final, tmp = root / name, root / f".tmp-{name}"
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_adapter(self.session, tmp / "adapter.safetensors", extra={"update": self.update})
        state = {"rng.torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
        state.update(opt_tensors)
        save_safetensors(state, tmp / "state.safetensors")
        files = ["adapter.safetensors", "state.safetensors"]
        if self.best["update"] is not None:
            try:
                os.link(self.out / BEST, tmp / BEST)  # best.safetensors is only ever replaced, never rewritten
            except OSError:
                shutil.copyfile(self.out / BEST, tmp / BEST)
                fsync_file(tmp / BEST)
            files.append(BEST)
        log = self.out / LOG
        log_data = b""
        if log.exists():
            fsync_file(log)
            log_data = log.read_bytes()
        py = random.getstate()
        manifest = {
            "format": CHECKPOINT_FORMAT, "update": self.update, "best": self.best, "time": time.time(),
            "config": config_record(self.cfg), "data": self.fingerprint,
            "schedule_updates": self.cfg.schedule_updates if self.cfg.schedule_updates is not None else self.cfg.updates,
            "requests_per_microbatch": self.per,
            "scheduler": self.scheduler.state_dict(), "optimizer": opt_meta,
            "python_rng": [py[0], list(py[1]), py[2]],
            "log": {"bytes": len(log_data), "sha256": hashlib.sha256(log_data).hexdigest()},
            "files": {f: {"bytes": (tmp / f).stat().st_size, "sha256": sha256_of(tmp / f)} for f in files},
        }
        write_durable(tmp / "manifest.json", dumps(manifest).encode())
        fsync_dir(tmp)
        if final.exists():  # an uncommitted leftover of an interrupted run (`latest` never named it)
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        write_atomic(root / POINTER, (name + "\n").encode())  # the commit
        self.checkpoint = name
        prune_checkpoints(root, name)  # only now: the checkpoints before this one

    def resume(self) -> bool:
        """Restore the run's committed checkpoint; False (a fresh start) when `out` holds no run.
        Refuses a run that has nothing to resume, a damaged checkpoint, or changed arguments."""
        ckpt = check_run_dir(self.out, resume=True)
        if ckpt is None:
            return False

        manifest = read_checkpoint(ckpt)
        check_resumable(manifest, self.cfg, self.fingerprint, str(self.out))
        if manifest.requests_per_microbatch != self.per:  # a checkpoint of an older version
            raise CheckpointError(f"was written when an update took {manifest.requests_per_microbatch} "
                                  f"request(s) per microbatch; this version takes {self.per} for this data, so the "
                                  "run cannot be resumed consistently — choose a new --out", source=str(ckpt))
        log = self.out / LOG
        log_data = read_file(log, max_bytes=MAX_LOG_BYTES, error=CheckpointError, what="a training log") \
            if os.path.lexists(log) else b""  # a FIFO or a device in its place is refused, never read
        keep = manifest.log.bytes
        if len(log_data) < keep or hashlib.sha256(log_data[:keep]).hexdigest() != manifest.log.sha256:
            raise CheckpointError(f"does not begin with the {keep} bytes the checkpoint {ckpt.name} recorded (it was "
                                  "replaced or edited); the run cannot be resumed consistently", source=str(log))
        try:
            state = load_file(str(ckpt / "state.safetensors"))
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            raise CheckpointError(f"cannot be read ({exc})", source=str(ckpt / "state.safetensors")) from None
        # Everything is verified: restore the trainer, then the files of the run.
        span = manifest.schedule_updates
        if span != self.cfg.updates:
            self.log(f"the learning-rate schedule keeps the span of {span} updates the run started with"
                     + (f"; updates {span + 1}–{self.cfg.updates} run at its final rate" if self.cfg.updates > span
                        else ""))
        self.cfg = msgspec.structs.replace(self.cfg, schedule_updates=span)
        load_adapter(self.session, ckpt / "adapter.safetensors")
        try:
            self.optimizer.load_state_dict(optimizer_state(state, manifest.optimizer, self.optimizer.state_dict()))
            self.scheduler.lr_lambdas = [_schedule(self.cfg)]
            self.scheduler.load_state_dict(scheduler_state(manifest.scheduler, self.scheduler.state_dict()))
        except (ValueError, KeyError, RuntimeError, TypeError, IndexError) as exc:
            raise CheckpointError(f"does not fit this model's optimizer ({short(exc, 200, str)})",
                                  source=str(ckpt)) from None
        torch.set_rng_state(state["rng.torch"])
        cuda = [state[k] for k in sorted((k for k in state if k.startswith("rng.cuda.")), key=lambda k: int(k[9:]))]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        v, internal, gauss = manifest.python_rng
        random.setstate((v, tuple(internal), gauss))
        self.update, self.best = manifest.update, {"update": manifest.best.update, "accuracy": manifest.best.accuracy}
        self.checkpoint = ckpt.name
        if not self.world.is_main:
            return True  # the run's files are rank 0's to restore
        if BEST in manifest.files:
            cur = self.out / BEST
            if not cur.exists() or sha256_of(cur) != manifest.files[BEST].sha256:
                write_atomic(cur, (ckpt / BEST).read_bytes())  # the selection as of the checkpoint
        if len(log_data) > keep:
            tail = log_data[keep:]
            dropped = tail.count(b"\n")
            partial = len(tail) - tail.rfind(b"\n") - 1  # bytes after the last complete record (a cut line)
            what = [f"{dropped} record{'s' * (dropped != 1)}"] if dropped else []
            what += [f"a cut last line ({partial} bytes without its end)"] if partial else []
            write_atomic(log, log_data[:keep])
            self.log(f"train_log.jsonl: dropped {' and '.join(what)} written after the checkpoint of update "
                     f"{self.update} (its updates are replayed)")
        prune_checkpoints(ckpt.parent, ckpt.name)  # what an interrupted save left (never named by `latest`)
        return True

    def _record(self, kind: str, **fields) -> None:
        if not self.world.is_main:
            return
        rec = {"kind": kind, "update": self.update, "time": time.time(),
               "rss_bytes": psutil.Process().memory_info().rss}
        if torch.cuda.is_available():
            rec["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        rec.update(fields)
        # One whole line or none: a full disk leaves the log valid up to its last complete record.
        append_line(self.out / LOG, dumps(rec, list_nonfinite=True), error=TrainingError)

    # -- lifecycle ----------------------------------------------------------------------------

    def _evaluate_dev(self) -> None:
        if not self.world.is_main:
            return
        metrics = evaluate(self.session, self.data.dev)
        self._record("dev", **metrics)
        if metrics["accuracy"] > self.best["accuracy"]:
            try:
                save_adapter(self.session, self.out / BEST, extra={"update": self.update})
            except OSError as exc:
                raise CheckpointError(f"update {self.update}: cannot be written ({exc.strerror or exc}); "
                                      f"{self._kept()}", source=str(self.out / BEST)) from None
            self.best = {"update": self.update, "accuracy": metrics["accuracy"]}
        self.log(f"update {self.update}: dev accuracy {metrics['accuracy']:.3f} (best {self.best['accuracy']:.3f} "
                 f"at update {self.best['update']})")

    def _kept(self) -> str:
        return f"the checkpoint {self.checkpoint} is intact" if self.checkpoint else "no checkpoint was committed"

    def _checkpoint(self) -> None:
        if not self.world.is_main:
            return
        try:
            self._save_checkpoint()
        except OSError as exc:  # a full disk, no permission (safetensors' own errors come as OSError)
            shutil.rmtree(self.out / CHECKPOINTS / f".tmp-update-{self.update:06d}", ignore_errors=True)
            raise CheckpointError(f"update {self.update}: the checkpoint cannot be written ({exc.strerror or exc}); "
                                  f"{self._kept()}", source=str(self.out / CHECKPOINTS)) from None

    def train(self, progress=None, stop_at: int | None = None) -> None:
        """Run updates up to cfg.updates (or `stop_at`, which simulates an interruption)."""
        if self.checkpoint is None and self.world.is_main:  # a fresh start: never over an existing run
            check_run_dir(self.out, resume=False)
            self._checkpoint()  # update 0, before anything else is written
        if self.update == 0 and self.best["update"] is None:
            self._evaluate_dev()  # step 0 is an eligible checkpoint
        n = len(self.data.train)
        end = self.cfg.updates if stop_at is None else min(stop_at, self.cfg.updates)
        order = ([self.data.train[i] for i in microbatch_order(n, self.cfg.seed, u, self.per)]
                 for u in range(self.update, end))
        for res in self.updater.run(order):
            if not (math.isfinite(res.loss) and math.isfinite(res.grad_norm)):
                u = self.update + 1
                msg = (f"update {u}: the loss is {res.loss} and the gradient norm {res.grad_norm} (not finite); "
                       f"training stopped, nothing of this update was saved — the checkpoint of update "
                       f"{self.checkpoint and int(self.checkpoint[7:])} and best.safetensors are intact; lower --lr "
                       "or check the training rewards, and start a new --out (--initialize-from its best.safetensors)")
                self._record("error", update=u, loss=res.loss, grad_norm=res.grad_norm, message=msg)
                raise TrainingError(msg, source=str(self.out))
            self.scheduler.step()
            self.update += 1
            if self.after_update is not None:
                self.after_update(self.world, self.update)
            self._record("update", loss=res.loss, grad_norm=res.grad_norm, lr=self.scheduler.get_last_lr()[0])
            if progress is not None:
                progress(self.update, res.loss)
            if self.update % self.cfg.eval_every == 0 or self.update == self.cfg.updates:
                self._evaluate_dev()
                self._checkpoint()

    def finish(self) -> dict:
        """Best adapter → merge → calibrate on `calib` → test. Writes summary.json."""
        model = api.load(self.cfg.model, adapter=self.out / BEST, merge=True, device=self.cfg.device,
                         seed=self.cfg.seed)
        logits, correct = question_logits(model.predict(self.data.calib), self.data.calib)
        model.temperature = fit_temperature(logits, correct)
        test_logits, test_correct = question_logits(model.predict(self.data.test), self.data.test)
        probs = torch.softmax(test_logits / model.temperature, dim=-1)
        summary = {
            "best_update": self.best["update"], "dev_accuracy": self.best["accuracy"],
            "temperature": model.temperature,
            "calibration_nll_before": nll(logits, correct, 1.0), "calibration_nll_after": nll(logits, correct, model.temperature),
            "test_accuracy": float((test_logits.argmax(-1) == test_correct).double().mean()),
            "test_nll": nll(test_logits, test_correct, model.temperature),
            "test_ece": expected_calibration_error(probs, test_correct),
            "test_questions": len(test_correct),
        }
        # Store the fitted temperature with the selected adapter (the weights are unchanged).
        best = api.load(self.cfg.model, adapter=self.out / BEST, device=self.cfg.device, seed=self.cfg.seed)
        best.temperature = model.temperature
        try:
            save_adapter(best, self.out / BEST, extra={"update": self.best["update"]})
            write_atomic(self.out / SUMMARY, dumps(summary, list_nonfinite=True, indent=2).encode())
        except OSError as exc:
            raise CheckpointError(f"the selected adapter or summary.json cannot be written ({exc.strerror or exc}); "
                                  f"{self._kept()}", source=str(self.out)) from None
        self._record("summary", **summary)
        return summary
