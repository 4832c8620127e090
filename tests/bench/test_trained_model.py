"""The specification's benchmark command: `python scripts/benchmark.py dohnuts --checkpoint RUN
--output FILE.jsonl` (and `dohnuts-bench run --checkpoint … --output …`) on a model `dohnuts train`
wrote: its prediction workloads run on the trained base with the selected adapter merged, the raw
records land in FILE.jsonl, and what cannot be benchmarked is refused in one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dohnuts.bench.measure.trained_model import serving_specs, trained_model
from dohnuts.cli import main as dohnuts_main
from dohnuts.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished `dohnuts train` run of the tiny preset (2 updates of the synthetic task)."""
    out = tmp_path_factory.mktemp("train") / "v1"
    assert dohnuts_main(["train", "--model", "tiny", "--out", str(out), "--updates", "2", "--eval-every", "2",
                         "--threads", "1", "--seed", "3"]) == 0
    return out


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_script", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_its_checkpoint_and_its_adapter_name_one_trained_model(trained_run):
    from dohnuts.train.checkpoints import latest_checkpoint

    run = trained_model(trained_run)
    assert (run.base, run.seed, run.adapter) == ("tiny", 3, trained_run / "best.safetensors")
    ckpt = latest_checkpoint(trained_run)
    assert trained_model(ckpt) == type(run)("tiny", 3, ckpt / "best.safetensors")
    assert trained_model(run.adapter) == run  # the adapter's base identity names the preset and seed


def test_prediction_workloads_serve_the_adapter_alone(trained_run):
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    specs = [load_workload(ROOT / "workloads" / f, kinds, targets) for f in ("text.yaml", "train-step.yaml")]
    (spec,) = serving_specs(specs, trained_model(trained_run))  # the training workload is left out
    assert spec.name == "text" and (spec.model, spec.seed) == ("tiny", 3)
    (target,) = spec.targets  # the transformers peer would run the base weights: dropped
    assert target.name == "dohnuts" and target.options == {"adapter": str(trained_run / "best.safetensors")}


@pytest.mark.slow(seconds=15)
def test_the_specification_s_command_writes_the_records(trained_run, tmp_path):
    output = tmp_path / "benchmarks" / "dohnuts.jsonl"  # its folder does not exist yet
    assert _script().main(["dohnuts", "--checkpoint", str(trained_run), "--output", str(output),
                           str(ROOT / "workloads" / "text.yaml"), "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert output.read_bytes() == (run_dir / "results.jsonl").read_bytes()
    steady = [r for r in records if r["phase"] == "steady"]
    assert steady and {r["target"] for r in records} == {"dohnuts"}
    assert all(r["target_options"] == {"adapter": str(trained_run / "best.safetensors")} for r in records)
    assert all(r["lora"]["merged"] for r in steady)  # served as `dohnuts predict --adapter` serves it
    assert all(r["model_source"] == "tiny" and r["wall_ms"] > 0 for r in steady)


def test_what_cannot_be_benchmarked_is_refused_in_one_line(trained_run, tmp_path, capsys):
    from dohnuts.bench.cli import main

    with pytest.raises(CheckpointError, match="neither a `dohnuts train` run directory"):
        trained_model(tmp_path)
    adapter = trained_run / "best.safetensors"
    before = adapter.read_bytes()
    assert main(["run", "--checkpoint", str(trained_run), "--output", str(adapter), "--out", str(tmp_path / "r")]) == 2
    assert "field '--output': is an input of this command" in capsys.readouterr().err  # the adapter it benchmarks
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    assert main(["run", "--checkpoint", str(trained_run), "--output", str(link), "--out", str(tmp_path / "r")]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert main(["run", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert adapter.read_bytes() == before and not (tmp_path / "r").exists()
    assert _script().main(["transformers", "--checkpoint", str(trained_run)]) == 2  # only dohnuts is benchmarked so
