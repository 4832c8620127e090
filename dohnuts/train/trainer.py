"""The training lifecycle: initialise, train, select, merge, calibrate, test — and resume.

    base init, or --initialize-from ADAPTER (verified unmerged LoRA + head weights)
    step 0: development score of the starting weights (an eligible selected checkpoint)
    updates of 4 microbatches (RLCD, AdamW over LoRA + head), dev evaluation every N updates,
        the best dev accuracy selects `best.safetensors` (ties keep the earlier one),
        `last.safetensors` + `state.pt` after every evaluation (what --resume restores:
        adapters, optimizer, scheduler, RNG states, update count, selection so far)
    after the last update: load `best`, merge LoRA, fit the temperature on the calibration
        partition, evaluate the test partition (accuracy, NLL, ECE) — test never selects or tunes.

Both starts run the identical data order, objective, schedule, selection and evaluation. The
data order is a pure function of (seed, update), so a resumed run sees the same microbatches.
Everything is recorded in `train_log.jsonl` (loss, grad norm, lr, dev quality, RSS, GPU memory).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import torch

from dohnuts.adapters import load_adapter, save_adapter
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.predict import RequestResult
from dohnuts.train.calibration import expected_calibration_error, fit_temperature, nll
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import MICROBATCHES, OptimConfig, Updater, make_optimizer


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    out: str = "runs/train"
    updates: int = 200
    eval_every: int = 25
    warmup: int = 10
    seed: int = 0
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    objective: RLCDConfig = field(default_factory=RLCDConfig)
    initialize_from: str | None = None
    device: str | None = None


@dataclass
class Partitions:
    train: list
    dev: list
    calib: list
    test: list


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
    def factor(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, cfg.updates - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def microbatch_order(n: int, seed: int, update: int) -> list[int]:
    """Indices of the 4 training requests of `update` (epoch-wise permutations of range(n))."""
    out = []
    for j in range(MICROBATCHES):
        k = update * MICROBATCHES + j
        epoch, pos = divmod(k, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(perm[pos])
    return out


class Trainer:
    def __init__(self, cfg: TrainConfig, data: Partitions, log=print):
        import dohnuts.api as api

        self.cfg, self.data, self.log = cfg, data, log
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.session = api.load(cfg.model, lora=None if cfg.initialize_from else cfg.lora, device=cfg.device,
                              seed=cfg.seed)
        if cfg.initialize_from:
            load_adapter(self.session, cfg.initialize_from)  # verifies the base identity
        self.optimizer = make_optimizer(self.session, cfg.optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(cfg))
        self.update = 0
        self.best = {"update": None, "accuracy": -1.0}
        self.updater = Updater(self.session, self.optimizer, cfg.objective, cfg.optim)

    def close(self) -> None:
        self.updater.close()

    # -- persistence --------------------------------------------------------------------------

    def _save_state(self) -> None:
        save_adapter(self.session, self.out / "last.safetensors")
        state = {
            "update": self.update, "best": self.best, "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python_rng": random.getstate(), "config": json.dumps(asdict(self.cfg), default=str),
        }
        tmp = self.out / "state.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.out / "state.pt")

    def resume(self) -> bool:
        path = self.out / "state.pt"
        if not path.exists():
            return False
        from dohnuts.errors import CheckpointError

        try:
            state = torch.load(path, weights_only=False)
        except Exception as exc:
            raise CheckpointError(f"cannot be read ({exc})", source=str(path)) from None
        load_adapter(self.session, self.out / "last.safetensors")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(state["python_rng"])
        self.update, self.best = state["update"], state["best"]
        return True

    def _record(self, kind: str, **fields) -> None:
        rec = {"kind": kind, "update": self.update, "time": time.time(),
               "rss_bytes": psutil.Process().memory_info().rss}
        if torch.cuda.is_available():
            rec["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        rec.update(fields)
        with (self.out / "train_log.jsonl").open("a") as f:
            f.write(json.dumps(rec) + "\n")

    # -- lifecycle ----------------------------------------------------------------------------

    def _evaluate_dev(self) -> None:
        metrics = evaluate(self.session, self.data.dev)
        self._record("dev", **metrics)
        if metrics["accuracy"] > self.best["accuracy"]:
            self.best = {"update": self.update, "accuracy": metrics["accuracy"]}
            save_adapter(self.session, self.out / "best.safetensors", extra={"update": self.update})
        self.log(f"update {self.update}: dev accuracy {metrics['accuracy']:.3f} (best {self.best['accuracy']:.3f} "
                 f"at update {self.best['update']})")

    def train(self, progress=None, stop_at: int | None = None) -> None:
        """Run updates up to cfg.updates (or `stop_at`, which simulates an interruption)."""
        if self.update == 0 and self.best["update"] is None:
            self._evaluate_dev()  # step 0 is an eligible checkpoint
            self._save_state()
        n = len(self.data.train)
        end = self.cfg.updates if stop_at is None else min(stop_at, self.cfg.updates)
        order = ([self.data.train[i] for i in microbatch_order(n, self.cfg.seed, u)] for u in range(self.update, end))
        for res in self.updater.run(order):
            self.scheduler.step()
            self.update += 1
            self._record("update", loss=res.loss, grad_norm=res.grad_norm, lr=self.scheduler.get_last_lr()[0])
            if progress is not None:
                progress(self.update, res.loss)
            if self.update % self.cfg.eval_every == 0 or self.update == self.cfg.updates:
                self._evaluate_dev()
                self._save_state()

    def finish(self) -> dict:
        """Best adapter → merge → calibrate on `calib` → test. Writes summary.json."""
        import dohnuts.api as api

        model = api.load(self.cfg.model, adapter=self.out / "best.safetensors", merge=True, device=self.cfg.device,
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
        best = api.load(self.cfg.model, adapter=self.out / "best.safetensors", device=self.cfg.device, seed=self.cfg.seed)
        best.temperature = model.temperature
        save_adapter(best, self.out / "best.safetensors", extra={"update": self.best["update"]})
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self._record("summary", **summary)
        return summary
