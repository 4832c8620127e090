"""A model `dohnuts train` wrote, benchmarked as it serves: `dohnuts-bench run --checkpoint PATH`.

The specification measures a trained model with

    python scripts/benchmark.py dohnuts --checkpoint runs/v1/checkpoint --output runs/v1/benchmarks/dohnuts.jsonl

complete prediction calls over text and image workloads — preprocessing and transfers included —
with raw timings, throughput, memory and board telemetry. Here that is the standard suite's
prediction workloads (or the files named) run by the dohnuts target on the trained model: its base
(the preset or checkpoint directory and seed the run trained from) with the selected adapter
merged, as `dohnuts predict --adapter` serves it. Training workloads are left out (a trained model
is benchmarked on predictions), and so are the peers: transformers would run the base weights,
not the trained ones. `--output` receives the run's raw JSONL when it ends.

PATH is a `dohnuts train --out` directory (its `best.safetensors`, the selected and calibrated
adapter; an unfinished run's latest checkpoint's selection), one of its checkpoints
(`checkpoints/update-N`), or an adapter file whose base is a preset (its base identity names it).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from dohnuts.adapters import read_adapter_meta
from dohnuts.bench.measure.workload import TargetSpec
from dohnuts.bench.report.status import log
from dohnuts.errors import CheckpointError, ConfigError
from dohnuts.train.checkpoints import latest_checkpoint, read_checkpoint

PREDICTION_TARGET = "dohnuts"
_PRESET_WEIGHTS = re.compile(r"preset:(?P<name>[\w.\-]+):seed(?P<seed>-?\d+):\w+")


@dataclass(frozen=True)
class TrainedModel:
    """The base the adapter was trained on (a preset name or checkpoint directory), its seed, and
    the adapter file the benchmark serves."""

    base: str
    seed: int
    adapter: Path


def trained_model(path: str | Path) -> TrainedModel:
    """The trained model at `path` (module docstring); CheckpointError naming it otherwise."""
    p = Path(path)
    if p.is_dir():
        if (p / "manifest.json").is_file():  # one checkpoint of a run
            ckpt, adapter = p, p / "best.safetensors"
        else:
            ckpt = latest_checkpoint(p)
            if ckpt is None:
                raise CheckpointError("is neither a `dohnuts train` run directory (no checkpoints/latest) nor one "
                                      "of its checkpoints (no manifest.json)", source=str(p))
            adapter = p / "best.safetensors"
            if not adapter.is_file():
                adapter = ckpt / "best.safetensors"
                log.warning("%s: the run has not finished: benchmarking the selection of its latest checkpoint, %s",
                            p, ckpt.name)
        manifest = read_checkpoint(ckpt)
        if not adapter.is_file():
            adapter = ckpt / "adapter.safetensors"  # no selection made yet: the last trained state
        base, seed = manifest.config.get("model"), manifest.config.get("seed", 0)
        if not isinstance(base, str) or isinstance(seed, bool) or not isinstance(seed, int):
            raise CheckpointError("names no base model and seed in its config (model, seed)",
                                  source=str(ckpt / "manifest.json"))
        read_adapter_meta(adapter)  # its header checked now, before anything is measured
        return TrainedModel(base=base, seed=seed, adapter=adapter)
    meta = read_adapter_meta(p)  # an adapter file: its base must be a preset its identity names
    weights = str(meta.base_identity.get("weights", ""))
    m = _PRESET_WEIGHTS.fullmatch(weights)
    if m is None:
        raise CheckpointError(f"was trained on {weights!r}, not a preset: benchmark its `dohnuts train` run "
                              "directory, whose config names the base", source=str(p))
    return TrainedModel(base=m["name"], seed=int(m["seed"]), adapter=p)


def serving_specs(specs: list, trained: TrainedModel) -> list:
    """The workloads to measure the trained model on: each prediction workload with the trained
    base, its seed, and the dohnuts target serving the adapter; training workloads left out, with
    the reason, and the peers dropped (they would run the base weights)."""
    out = []
    for spec in specs:
        if spec.kind == "train-step":
            log.info("skipped %s: a trained model is benchmarked on prediction calls (--checkpoint)", spec.file)
            continue
        if max(spec.processes) > 1:
            raise ConfigError("measures several processes; --checkpoint benchmarks one", source=spec.file,
                              field="processes")
        dropped = [t.label for t in spec.targets if t.name != PREDICTION_TARGET]
        if dropped:
            log.info("%s: --checkpoint measures the trained model alone (not %s: they would run the base weights)",
                     spec.file, ", ".join(dropped))
        target = TargetSpec(name=PREDICTION_TARGET, label=PREDICTION_TARGET, options={"adapter": str(trained.adapter)})
        out.append(dataclasses.replace(spec, model=trained.base, seed=trained.seed, targets=(target,)))
    if not out:
        raise ConfigError("holds no prediction workload to benchmark a trained model on", source="command line",
                          field="workloads")
    return out
