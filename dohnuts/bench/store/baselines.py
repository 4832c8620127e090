"""Gate baselines: per machine, runs of the same workloads spread over time, kept in
`results/baselines/<machine id>/` (`dohnuts-bench baseline` makes one, `dohnuts-bench gate`
reads it): `run-1/`, `run-2/`, … each a run's run.json and results.jsonl.gz, and baseline.json
naming the machine and the runs."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import msgspec

from dohnuts.errors import DohnutsError
from dohnuts.schema import MIB, read_json

DEFAULT_ROOT = Path("results/baselines")
MANIFEST = "baseline.json"


class BaselineManifest(msgspec.Struct):
    """A baseline folder's baseline.json (what `dohnuts-bench baseline` writes; other keys are ignored)."""

    runs: list[str]  # the run folders, in the order they were measured
    machine: str | None = None  # the machine id the baseline was measured on


def _manifest(folder: Path) -> BaselineManifest:
    """A baseline folder's manifest, typed (dohnuts.schema.read_json: a regular file within bounds,
    checked by its stat; one line naming the file and the field otherwise)."""
    return read_json(folder / MANIFEST, BaselineManifest, max_bytes=MIB, error=DohnutsError,
                     what="a baseline manifest")


def baseline_runs(folder: Path) -> list[Path]:
    """The run directories of a baseline folder (its baseline.json), in order."""
    return [folder / name for name in _manifest(folder).runs]


def baseline_machine(folder: Path) -> str | None:
    """The machine a baseline folder was measured on (None when its manifest does not say)."""
    try:
        return _manifest(folder).machine
    except DohnutsError:
        return None


def compact_run(run_dir: Path, dest: Path) -> None:
    """Keep what the gate reads of a run: run.json and the records, gzipped (as committed runs are)."""
    dest.mkdir(parents=True)
    shutil.copy2(run_dir / "run.json", dest / "run.json")
    with open(run_dir / "results.jsonl", "rb") as src, \
            gzip.GzipFile(dest / "results.jsonl.gz", "wb", mtime=0) as out:
        shutil.copyfileobj(src, out)
