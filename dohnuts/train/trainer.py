"""The training lifecycle: initialise, train, select, merge, calibrate, test — and resume.

    base init, or --initialize-from ADAPTER (verified unmerged LoRA + head weights)
    checkpoint of update 0 (before anything else is written: every started run can be resumed)
    step 0: development score of the starting weights (an eligible selected checkpoint)
    updates of 4 microbatches (RLCD, AdamW over LoRA + head), dev evaluation every N updates,
        the best dev accuracy selects `best.safetensors` (ties keep the earlier one),
        a checkpoint after every evaluation (what --resume restores: adapters, optimizer,
        scheduler, RNG states, update count, selection so far, the length of the log)
    after the last update: load `best`, merge LoRA, fit the temperature on the calibration
        partition, evaluate the test partition (accuracy, NLL, ECE) — test never selects or tunes.

Both starts run the identical data order, objective, schedule, selection and evaluation. The
data order is a pure function of (seed, update), so a resumed run sees the same microbatches.
Everything is recorded in `train_log.jsonl` (loss, grad norm, lr, dev quality, RSS, GPU memory);
it is strict JSON: a non-finite number is written as null and named in the record's `nonfinite`.

The run directory (`--out`):

    checkpoints/update-000040/   one checkpoint = one directory, complete or ignored:
        adapter.safetensors      LoRA + head (the adapter format of dohnuts.adapters)
        state.safetensors        optimizer tensors, torch (and CUDA) RNG states
        best.safetensors         the selected adapter as of this update (a hard link when possible)
        manifest.json            update, selection, config, data fingerprint, scheduler and
                                 optimizer hyper-parameters, Python RNG state (JSON, no pickle),
                                 the log's length and hash, and the size and SHA-256 of each file
    checkpoints/latest           the name of the committed checkpoint
    best.safetensors, train_log.jsonl, summary.json

A checkpoint is written into `checkpoints/.tmp-update-N/`, every file fsynced, renamed to
`update-N/`, and only then committed by atomically replacing `latest` (write, fsync, rename);
older checkpoints are deleted after the switch. An interruption at any point leaves `latest`
naming a complete checkpoint (the new one or the one before); anything it does not name is
ignored. Resume reads `latest`, verifies the files against the manifest, restores
`best.safetensors` as of that checkpoint and cuts `train_log.jsonl` back to the length it had
then (a new file renamed over the old one), so updates replayed after a resume are logged once.

A run continues only with the arguments it started with (`check_resumable`): `updates` may
change (not below the checkpoint's update; the learning-rate schedule keeps the span it was laid
out for, so updates beyond it run at its final rate) and `device` may change (the adapter's base
identity still has to match); anything that changes the objective, the schedule, the data, its
order, the selection or the adapters may not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil
import torch

from dohnuts.adapters import fsync_dir, fsync_file, load_adapter, read_adapter, save_adapter
from dohnuts.errors import CheckpointError, ConfigError, DohnutsError
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.predict import RequestResult
from dohnuts.train.calibration import expected_calibration_error, fit_temperature, nll
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import MICROBATCHES, OptimConfig, Updater, make_optimizer

CHECKPOINT_FORMAT = "dohnuts-checkpoint-1"
CHECKPOINTS = "checkpoints"
POINTER = "latest"
LOG = "train_log.jsonl"
BEST = "best.safetensors"
SUMMARY = "summary.json"
_NAME = re.compile(r"update-\d{6,}")
_OLD_LAYOUT = ("state.pt", "last.safetensors")

# TrainConfig fields (flattened) → the `dohnuts train` argument that sets them.
ARGUMENTS = {
    "model": "--model", "data": "--data", "updates": "--updates", "eval_every": "--eval-every", "seed": "--seed",
    "lora.rank": "--lora-rank", "lora.alpha": "--lora-alpha", "optim.lr": "--lr",
    "optim.max_grad_norm": "--max-grad-norm", "objective.margin_weight": "--margin-weight",
    "objective.margin": "--margin", "initialize_from": "--initialize-from", "device": "--device",
}
# What a resumed run may change (`updates` is checked on its own: not below the checkpoint; the
# data is compared by content, so a moved --data folder is the same data).
RESUME_MAY_CHANGE = ("out", "device", "updates", "schedule_updates", "optim.checkpoint_layers", "data")


class TrainingError(DohnutsError):
    """Training cannot go on (a non-finite loss or gradient norm); what was saved stays intact."""


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
    data: str | None = None  # what the partitions came from (a folder; None: given in code / synthetic)
    schedule_updates: int | None = None  # the span of the lr schedule (None: `updates`; kept on resume)


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
    span = cfg.schedule_updates if cfg.schedule_updates is not None else cfg.updates

    def factor(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, span - cfg.warmup)
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


# -- validation --------------------------------------------------------------------------------


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_config(cfg: TrainConfig) -> None:
    """Refuse values that would divide by zero, never evaluate, or put NaN into the objective."""
    def integer(v, least):
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    o, lora, obj = cfg.optim, cfg.lora, cfg.objective
    checks = [
        ("updates", cfg.updates, integer(cfg.updates, 0), "must be an integer ≥ 0"),
        ("eval_every", cfg.eval_every, integer(cfg.eval_every, 1), "must be an integer ≥ 1"),
        ("warmup", cfg.warmup, integer(cfg.warmup, 0), "must be an integer ≥ 0"),
        ("optim.lr", o.lr, _finite(o.lr) and o.lr > 0, "must be a finite number > 0"),
        ("optim.max_grad_norm", o.max_grad_norm, isinstance(o.max_grad_norm, (int, float)) and o.max_grad_norm > 0,
         "must be a number > 0 (inf: no clipping)"),
        ("lora.rank", lora.rank, integer(lora.rank, 1), "must be an integer ≥ 1"),
        ("lora.alpha", lora.alpha, _finite(lora.alpha) and lora.alpha > 0, "must be a finite number > 0"),
        ("objective.margin_weight", obj.margin_weight, _finite(obj.margin_weight) and obj.margin_weight >= 0,
         "must be a finite number ≥ 0"),
        ("objective.margin", obj.margin, _finite(obj.margin), "must be a finite number"),
    ]
    for key, value, ok, why in checks:
        if not ok:
            raise ConfigError(f"{why}, got {value!r}", source=ARGUMENTS.get(key, key))


def validate_data(data: Partitions) -> None:
    """Every partition holds requests, and every question has finite rewards (no NaN reaches the
    objective or the selection, whatever the reader let through)."""
    for split in ("train", "dev", "calib", "test"):
        reqs = getattr(data, split)
        if not reqs:
            raise ConfigError("holds no requests", source=f"the {split} partition")
        for req in reqs:
            for q in req.questions:
                if q.rewards is None:
                    raise ConfigError("training data needs 'answer' or 'rewards' on every question",
                                      source=f"{split} request {req.id!r}", field=f"questions.{q.id}")
                if not all(_finite(r) for r in q.rewards):
                    raise ConfigError(f"has a non-finite reward {list(q.rewards)}", source=f"{split} request {req.id!r}",
                                      field=f"questions.{q.id}.rewards")


def data_fingerprint(data: Partitions) -> dict[str, str]:
    """SHA-256 of each partition's requests (ids, texts, candidates, rewards, images, prefixes)."""
    out = {}
    for split in ("train", "dev", "calib", "test"):
        h = hashlib.sha256()
        for req in getattr(data, split):
            obj = asdict(req) if dataclasses.is_dataclass(req) else repr(req)
            h.update(json.dumps(obj, sort_keys=True, default=str).encode())
            h.update(b"\n")
        out[split] = h.hexdigest()
    return out


# -- strict JSON -------------------------------------------------------------------------------


def _strict(obj, path: str = "", bad: list | None = None):
    """obj with every non-finite float replaced by None (its dotted path appended to `bad`)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        bad.append(path)
        return None
    if isinstance(obj, dict):
        return {k: _strict(v, f"{path}.{k}" if path else str(k), bad) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v, f"{path}.{i}", bad) for i, v in enumerate(obj)]
    return obj


def strict_json(obj: dict, **kw) -> str:
    """JSON without NaN/Infinity: non-finite numbers become null, listed under `nonfinite`."""
    bad: list[str] = []
    clean = _strict(obj, "", bad)
    if bad:
        clean["nonfinite"] = bad
    return json.dumps(clean, allow_nan=False, **kw)


# -- files -------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` by `data` all at once (write a temporary file, fsync, rename, fsync the folder)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    _write_durable(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# -- the run directory ---------------------------------------------------------------------------


def run_contents(out: str | Path) -> list[str]:
    """What of a training run `out` holds ([] for a new folder, or one with nothing but checkpoint
    directories that were never committed: an interrupted first checkpoint)."""
    out = Path(out)
    found = []
    if (out / CHECKPOINTS / POINTER).exists():
        found.append(f"{CHECKPOINTS}/{POINTER}")
    found += [n for n in (LOG, BEST, SUMMARY, *_OLD_LAYOUT) if (out / n).exists()]
    return found


def latest_checkpoint(out: str | Path) -> Path | None:
    """The committed checkpoint directory of the run in `out` (what --resume restores), or None."""
    ptr = Path(out) / CHECKPOINTS / POINTER
    try:
        name = ptr.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot be read ({exc})", source=str(ptr)) from None
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"names {name!r}, not a checkpoint directory (update-NNNNNN)", source=str(ptr))
    ckpt = ptr.parent / name
    if not (ckpt / "manifest.json").is_file():
        raise CheckpointError(f"names {name}, which has no manifest.json (the checkpoint is missing or damaged)",
                              source=str(ptr))
    return ckpt


def check_run_dir(out: str | Path, *, resume: bool) -> Path | None:
    """Refuse to start over in a folder that holds a run, and to resume one with nothing to resume.
    Returns the checkpoint to resume from (None: a fresh start)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("exists and is not a directory", source=str(out))
    found = run_contents(out)
    if any(n in _OLD_LAYOUT for n in found) and f"{CHECKPOINTS}/{POINTER}" not in found:
        raise CheckpointError("holds a run of an older dohnuts layout (state.pt + last.safetensors), which cannot "
                              "be resumed safely; choose a new --out (its best.safetensors can seed it with "
                              "--initialize-from)", source=str(out))
    if not resume:
        if found:
            raise CheckpointError(f"already holds a training run ({', '.join(found)}); add --resume to continue it, "
                                  "or choose a new --out (nothing was overwritten)", source=str(out))
        return None
    ckpt = latest_checkpoint(out)
    if ckpt is None and found:
        raise CheckpointError(f"has nothing to resume: no committed checkpoint ({CHECKPOINTS}/{POINTER}) beside "
                              f"{', '.join(found)}; choose a new --out", source=str(out))
    return ckpt


def _config_record(cfg: TrainConfig) -> dict:
    """The config as flat JSON values ('lora.rank': 2, …), paths made absolute."""
    raw = json.loads(json.dumps(asdict(cfg), default=str))
    flat = {}

    def walk(obj, prefix):
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(raw, "")
    for key in ("model", "data", "initialize_from", "out"):
        v = flat.get(key)
        if isinstance(v, str) and Path(v).exists():  # a path (a preset name or "synthetic:N" stays as it is)
            flat[key] = str(Path(v).resolve())
    return flat


def read_checkpoint(ckpt: Path) -> dict:
    """The manifest of a committed checkpoint, its files verified (size and SHA-256)."""
    mpath = ckpt / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        if manifest.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"is {manifest.get('format')!r}, expected {CHECKPOINT_FORMAT!r}", source=str(mpath),
                                  field="format")
        for name, info in manifest["files"].items():
            path = ckpt / name
            if not path.is_file() or path.stat().st_size != info["bytes"] or _sha256(path) != info["sha256"]:
                raise CheckpointError("does not match the checkpoint's manifest (missing or damaged)",
                                      source=str(path))
        for key in ("update", "best", "config", "data", "scheduler", "optimizer", "python_rng", "log",
                    "schedule_updates"):
            manifest[key]  # present
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"cannot be read ({type(exc).__name__}: {exc})", source=str(mpath)) from None
    return manifest


def check_resumable(manifest: dict, cfg: TrainConfig, fingerprint: dict, source: str) -> None:
    """Refuse to continue a run with arguments that change what it computes (naming the argument,
    the saved value and the new one)."""
    saved, new = manifest["config"], _config_record(cfg)
    for key in sorted(set(saved) | set(new)):
        if key in RESUME_MAY_CHANGE or saved.get(key) == new.get(key):
            continue
        arg = ARGUMENTS.get(key, key)
        raise ConfigError(f"{arg} is {new.get(key)!r} but the run was started with {arg} {saved.get(key)!r}; "
                          "--resume continues a run with its own arguments (only --updates and --device may "
                          "change) — resume with the saved value, or choose a new --out", source=source)
    if cfg.updates < manifest["update"]:
        raise ConfigError(f"--updates is {cfg.updates} but the checkpoint is already at update {manifest['update']}; "
                          "a run cannot be shortened below its checkpoint", source=source)
    for split, digest in manifest["data"].items():
        if fingerprint.get(split) != digest:
            raise ConfigError(f"--data: the {split} requests differ from those the run was started with "
                              f"(--data {manifest['config'].get('data')}); resume with the original data, or choose "
                              "a new --out", source=source)


def _optimizer_flat(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            key = f"optimizer.{pid}.{k}"
            if torch.is_tensor(v):
                tensors[key] = v.detach().cpu().contiguous()
            else:
                scalars[key] = v
    groups = []
    for g in sd["param_groups"]:
        if any(torch.is_tensor(v) for v in g.values()):
            raise CheckpointError("an optimizer hyper-parameter is a tensor, which checkpoints do not store",
                                  source="optimizer")
        groups.append(dict(g))
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict, template: dict) -> dict:
    state: dict[int, dict] = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        if key.startswith("optimizer."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    groups = []
    for g, t in zip(meta["param_groups"], template["param_groups"]):
        groups.append({k: tuple(v) if isinstance(t.get(k), tuple) and isinstance(v, list) else v
                       for k, v in g.items()})
    return {"state": state, "param_groups": groups}


def _prune(root: Path, keep: str) -> None:
    """Delete everything in checkpoints/ but the committed checkpoint `keep` and the pointer."""
    for child in root.iterdir():
        if child.name not in (keep, POINTER):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


class Trainer:
    def __init__(self, cfg: TrainConfig, data: Partitions, log=print):
        import dohnuts.api as api

        validate_config(cfg)
        validate_data(data)
        self.cfg, self.data, self.log = cfg, data, log
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
        self.updater = Updater(self.session, self.optimizer, cfg.objective, cfg.optim)

    def close(self) -> None:
        self.updater.close()

    # -- persistence --------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        """Write the state of `self.update` as a new checkpoint directory, then commit it."""
        from safetensors.torch import save_file

        root = self.out / CHECKPOINTS
        name = f"update-{self.update:06d}"
        if name == self.checkpoint:
            return
        adapters = {k: v for k, v in self.session.model.named_parameters() if v.requires_grad}
        opt_tensors, opt_meta = _optimizer_flat(self.optimizer.state_dict())
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
        save_file(state, str(tmp / "state.safetensors"))
        fsync_file(tmp / "state.safetensors")
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
            "config": _config_record(self.cfg), "data": self.fingerprint,
            "schedule_updates": self.cfg.schedule_updates if self.cfg.schedule_updates is not None else self.cfg.updates,
            "scheduler": self.scheduler.state_dict(), "optimizer": opt_meta,
            "python_rng": [py[0], list(py[1]), py[2]],
            "log": {"bytes": len(log_data), "sha256": hashlib.sha256(log_data).hexdigest()},
            "files": {f: {"bytes": (tmp / f).stat().st_size, "sha256": _sha256(tmp / f)} for f in files},
        }
        _write_durable(tmp / "manifest.json", json.dumps(manifest, allow_nan=False).encode())
        fsync_dir(tmp)
        if final.exists():  # an uncommitted leftover of an interrupted run (`latest` never named it)
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        write_atomic(root / POINTER, (name + "\n").encode())  # the commit
        self.checkpoint = name
        _prune(root, name)  # only now: the checkpoints before this one

    def resume(self) -> bool:
        """Restore the run's committed checkpoint; False (a fresh start) when `out` holds no run.
        Refuses a run that has nothing to resume, a damaged checkpoint, or changed arguments."""
        ckpt = check_run_dir(self.out, resume=True)
        if ckpt is None:
            return False
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        manifest = read_checkpoint(ckpt)
        check_resumable(manifest, self.cfg, self.fingerprint, str(self.out))
        log = self.out / LOG
        log_data = log.read_bytes() if log.exists() else b""
        keep = manifest["log"]["bytes"]
        if len(log_data) < keep or hashlib.sha256(log_data[:keep]).hexdigest() != manifest["log"]["sha256"]:
            raise CheckpointError(f"does not begin with the {keep} bytes the checkpoint {ckpt.name} recorded (it was "
                                  "replaced or edited); the run cannot be resumed consistently", source=str(log))
        try:
            state = load_file(str(ckpt / "state.safetensors"))
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            raise CheckpointError(f"cannot be read ({exc})", source=str(ckpt / "state.safetensors")) from None
        # Everything is verified: restore the trainer, then the files of the run.
        span = manifest["schedule_updates"]
        if span != self.cfg.updates:
            self.log(f"the learning-rate schedule keeps the span of {span} updates the run started with"
                     + (f"; updates {span + 1}–{self.cfg.updates} run at its final rate" if self.cfg.updates > span
                        else ""))
        self.cfg = replace(self.cfg, schedule_updates=span)
        load_adapter(self.session, ckpt / "adapter.safetensors")
        try:
            self.optimizer.load_state_dict(_optimizer_state(state, manifest["optimizer"], self.optimizer.state_dict()))
            self.scheduler.lr_lambdas = [_schedule(self.cfg)]
            self.scheduler.load_state_dict(dict(manifest["scheduler"]))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"does not fit this model's optimizer ({exc})", source=str(ckpt)) from None
        torch.set_rng_state(state["rng.torch"])
        cuda = [state[k] for k in sorted((k for k in state if k.startswith("rng.cuda.")), key=lambda k: int(k[9:]))]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        v, internal, gauss = manifest["python_rng"]
        random.setstate((v, tuple(internal), gauss))
        self.update, self.best = manifest["update"], dict(manifest["best"])
        self.checkpoint = ckpt.name
        if BEST in manifest["files"]:
            cur = self.out / BEST
            if not cur.exists() or _sha256(cur) != manifest["files"][BEST]["sha256"]:
                write_atomic(cur, (ckpt / BEST).read_bytes())  # the selection as of the checkpoint
        if len(log_data) > keep:
            dropped = log_data[keep:].count(b"\n")
            write_atomic(log, log_data[:keep])
            self.log(f"train_log.jsonl: dropped {dropped} records written after the checkpoint of update "
                     f"{self.update} (they are replayed)")
        _prune(ckpt.parent, ckpt.name)  # what an interrupted save left (never named by `latest`)
        return True

    def _record(self, kind: str, **fields) -> None:
        rec = {"kind": kind, "update": self.update, "time": time.time(),
               "rss_bytes": psutil.Process().memory_info().rss}
        if torch.cuda.is_available():
            rec["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        rec.update(fields)
        with (self.out / LOG).open("a") as f:
            f.write(strict_json(rec) + "\n")

    # -- lifecycle ----------------------------------------------------------------------------

    def _evaluate_dev(self) -> None:
        metrics = evaluate(self.session, self.data.dev)
        self._record("dev", **metrics)
        if metrics["accuracy"] > self.best["accuracy"]:
            self.best = {"update": self.update, "accuracy": metrics["accuracy"]}
            save_adapter(self.session, self.out / BEST, extra={"update": self.update})
        self.log(f"update {self.update}: dev accuracy {metrics['accuracy']:.3f} (best {self.best['accuracy']:.3f} "
                 f"at update {self.best['update']})")

    def _checkpoint(self) -> None:
        try:
            self._save_checkpoint()
        except OSError as exc:
            kept = f"the checkpoint {self.checkpoint} is intact" if self.checkpoint else "no checkpoint was committed"
            raise CheckpointError(f"update {self.update}: the checkpoint cannot be written ({exc.strerror or exc}); "
                                  f"{kept}", source=str(self.out / CHECKPOINTS)) from None

    def train(self, progress=None, stop_at: int | None = None) -> None:
        """Run updates up to cfg.updates (or `stop_at`, which simulates an interruption)."""
        if self.checkpoint is None:  # a fresh start: never over an existing run
            check_run_dir(self.out, resume=False)
            self._checkpoint()  # update 0, before anything else is written
        if self.update == 0 and self.best["update"] is None:
            self._evaluate_dev()  # step 0 is an eligible checkpoint
        n = len(self.data.train)
        end = self.cfg.updates if stop_at is None else min(stop_at, self.cfg.updates)
        order = ([self.data.train[i] for i in microbatch_order(n, self.cfg.seed, u)] for u in range(self.update, end))
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
            self._record("update", loss=res.loss, grad_norm=res.grad_norm, lr=self.scheduler.get_last_lr()[0])
            if progress is not None:
                progress(self.update, res.loss)
            if self.update % self.cfg.eval_every == 0 or self.update == self.cfg.updates:
                self._evaluate_dev()
                self._checkpoint()

    def finish(self) -> dict:
        """Best adapter → merge → calibrate on `calib` → test. Writes summary.json."""
        import dohnuts.api as api

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
        save_adapter(best, self.out / BEST, extra={"update": self.best["update"]})
        write_atomic(self.out / SUMMARY, strict_json(summary, indent=2).encode())
        self._record("summary", **summary)
        return summary


def checkpoint_adapter(out: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter tensors and metadata of the run's committed checkpoint (the last trained state)."""
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        raise CheckpointError("has no committed checkpoint", source=str(out))
    return read_adapter(ckpt / "adapter.safetensors")
