"""What a training run is: its config (`TrainConfig`, a frozen msgspec Struct) and its data.

    TrainConfig(model, out, updates ≥ 0, eval_every ≥ 1, warmup ≥ 0, seed in 0..2³²−1,
                lora: LoRAConfig (rank in 1..1024, alpha finite > 0, dropout in [0, 1), targets),
                optim: OptimConfig (lr finite > 0, weight_decay finite ≥ 0, betas in [0, 1),
                                    max_grad_norm > 0, inf: no clipping),
                objective: RLCDConfig (margin_weight finite ≥ 0, margin finite),
                initialize_from, device, data, schedule_updates)

Every bound is declared once, on the field's type (msgspec `Meta`), and checked
by `train_config` (`dohnuts train`'s arguments, before anything is read or written) and by
`validate_config` (any config, e.g. one built in code, when a Trainer starts). An error names the
`dohnuts train` argument that sets the field (`ARGUMENTS`): `--lr: must be positive, got -0.001`.

`Partitions` is the data: train, dev, calib and test requests, every question labelled
(`dohnuts.runtime.requests.require_rewards`) with finite rewards (`validate_data`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from dohnuts.errors import ConfigError
from dohnuts.limits import MAX_SEED
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.requests import require_rewards
from dohnuts.schema import is_finite, problem
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig

# TrainConfig fields (flattened) → the `dohnuts train` argument that sets them.
ARGUMENTS = {
    "model": "--model", "data": "--data", "updates": "--updates", "eval_every": "--eval-every", "seed": "--seed",
    "lora.rank": "--lora-rank", "lora.alpha": "--lora-alpha", "optim.lr": "--lr",
    "optim.max_grad_norm": "--max-grad-norm", "objective.margin_weight": "--margin-weight",
    "objective.margin": "--margin", "initialize_from": "--initialize-from", "device": "--device",
}


class TrainConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: str = "tiny"
    out: str = "runs/train"
    updates: Annotated[int, Meta(ge=0)] = 200
    eval_every: Annotated[int, Meta(ge=1)] = 25
    warmup: Annotated[int, Meta(ge=0)] = 10
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] = 0  # dohnuts.limits: what every generator takes
    lora: LoRAConfig = msgspec.field(default_factory=LoRAConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    objective: RLCDConfig = msgspec.field(default_factory=RLCDConfig)
    initialize_from: str | None = None
    device: str | None = None
    data: str | None = None  # what the partitions came from (a folder; None: given in code / synthetic)
    schedule_updates: int | None = None  # the span of the lr schedule (None: `updates`; kept on resume)


def train_config(values: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from plain values (nested sections as dicts), every bound checked; an error
    names the argument that sets the field (ConfigError, one line)."""
    try:
        return msgspec.convert(values, TrainConfig)
    except msgspec.ValidationError as exc:
        err = problem(exc, TrainConfig, values, source=None)
        raise ConfigError(err.message, source=ARGUMENTS.get(err.field, err.field)) from None


def validate_config(cfg: TrainConfig) -> None:
    """Check a config built in code against the bounds its types declare (as `train_config`):
    nothing that would divide by zero, never evaluate, or put NaN into the objective."""
    train_config(msgspec.to_builtins(cfg))


@dataclass
class Partitions:
    train: list
    dev: list
    calib: list
    test: list


SPLITS = ("train", "dev", "calib", "test")


def validate_data(data: Partitions) -> None:
    """Every partition holds requests, and every question has finite rewards (no NaN reaches the
    objective or the selection, whatever the reader let through)."""
    for split in SPLITS:
        reqs = getattr(data, split)
        if not reqs:
            raise ConfigError("holds no requests", source=f"the {split} partition")
        for req in reqs:
            require_rewards(req, source=f"{split} request {req.id!r}")
            for i, q in enumerate(req.questions):
                if not all(is_finite(r) for r in q.rewards):
                    raise ConfigError(f"has a non-finite reward {list(q.rewards)}", source=f"{split} request "
                                      f"{req.id!r}", field=f"questions[{i}].rewards")
