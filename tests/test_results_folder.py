"""results/ holds curated reference runs, not a lab notebook (issue 46): under 3 MB of tracked files;
results/ and each hardware folder in it say in a README what they hold; every run in it is a run of
the whole standard suite (a hardware's reference and history, or a gate baseline's run); the gate's
baselines are in one format, `dohnuts-bench baseline`'s folders; no script lives there. A user's
own runs go to runs/bench/, which git ignores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
LIMIT_BYTES = 3_000_000
RUN_FILES = ("results.jsonl.gz", "results.jsonl")


def _tracked(folder: str) -> list[Path]:
    """The files git tracks under `folder` (ignored and untracked files left out: a user's store)."""
    done = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def _runs(files: list[Path]) -> list[Path]:
    return sorted({f.parent for f in files if f.name in RUN_FILES})


def _standard_suite() -> set[str]:
    """The standard suite's workload names: workloads/*.yaml, each named by its file."""
    return {p.stem for p in (ROOT / "workloads").glob("*.yaml")}


def test_results_stays_under_3_mb():
    files = _tracked("results")
    total = sum(f.stat().st_size for f in files)
    assert files and total < LIMIT_BYTES, (
        f"results/ holds {total / 1e6:.2f} MB of tracked files (limit {LIMIT_BYTES / 1e6:g} MB): it keeps reference "
        "runs only; an experiment's numbers and command go into the ledger (docs/history/)")


def test_results_and_each_hardware_folder_have_a_readme():
    assert (RESULTS / "README.md").is_file()
    folders = {f.relative_to(RESULTS).parts[0] for f in _tracked("results") if f.parent != RESULTS}
    assert {"baselines", "h200"} <= folders
    for name in sorted(folders - {"baselines"}):
        assert (RESULTS / name / "README.md").is_file(), f"results/{name}/ has no README.md"


def test_every_run_in_results_is_a_standard_suite_run_and_nothing_is_a_script():
    files = _tracked("results")
    suite = _standard_suite()
    assert {"text", "shared-prefix", "train-step"} <= suite
    runs = _runs(files)
    assert len(runs) >= 4
    for run in runs:
        names = {w["name"] for w in json.loads((run / "run.json").read_text())["workloads"]}
        assert suite <= names, f"{run.relative_to(ROOT)} is not a standard-suite run (lacks {sorted(suite - names)})"
    scripts = [f.relative_to(ROOT) for f in files if f.suffix in (".py", ".sh", ".ipynb")]
    assert not scripts, f"scripts in results/: {scripts}"


def test_the_gate_baselines_are_in_one_format():
    """results/baselines/ holds only `dohnuts-bench baseline` folders: <machine id>/baseline.json naming
    its runs, each a run directory of that machine (the pytest-benchmark files once beside them are gone)."""
    files = _tracked("results/baselines")
    machines = {f.relative_to(RESULTS / "baselines").parts[0] for f in files}
    assert machines and all((RESULTS / "baselines" / m).is_dir() for m in machines)
    for machine in sorted(machines):
        folder = RESULTS / "baselines" / machine
        manifest = json.loads((folder / "baseline.json").read_text())
        assert manifest["machine"] == machine and len(manifest["runs"]) >= 2
        runs = {folder / r for r in manifest["runs"]}
        assert set(_runs([f for f in files if folder in f.parents])) == runs
        assert {f for f in files if folder in f.parents} == {folder / "baseline.json"} | {
            r / n for r in runs for n in ("run.json", "results.jsonl.gz")}
        for run in runs:
            assert json.loads((run / "run.json").read_text())["measured"]["machine"]["id"] == machine


def test_a_users_runs_go_outside_results_into_an_ignored_folder():
    from dohnuts.bench.commands.options import DEFAULT_RESULTS
    from dohnuts.bench.store.run_store import DEFAULT_STORE

    for default in (DEFAULT_RESULTS, DEFAULT_STORE):
        assert default.parts[0] != "results", default
        probe = default / "run.json" if default is DEFAULT_RESULTS else default
        ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
        assert ignored.returncode == 0, f"{probe} is not ignored by git"
