"""A run's records, run.json and summary.json with what depends on time or on the host set
aside: what `dohnuts-bench run` must keep producing when its code is reorganised
(tests/bench/test_records_unchanged.py compares a fresh CPU run with the golden file this writes).

    python tests/bench/record_shapes.py RUN_DIR > tests/bench/fixtures/cpu-standard-suite-shapes.json

Set aside: times (every `*_ms`, `*_s`, `*_j` field, `wall_ms`, the run's id and clock), the host
(telemetry samples, provenance, the machine's id, CPU model and load, the peers' installed
transformers and peft versions), the loss and gradient norm of a
training step (they follow its iteration, and how many iterations a run measures follows the
spread of its times), and each measured number of the run's ceilings. What stays: every field's
name and, for the fields that do not depend on time, its value: workloads, targets, phases, work
counts, tokens, models, the agreement with the reference, the image cache's counters, the energy's
reason. A value set aside keeps its type's name, so a field that appears, disappears or changes
type still shows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# fields whose value follows the clock or the host: their type is kept, not their value
TIME_KEYS = {"run_id", "iteration", "aa_half", "telemetry", "provenance", "harness_overhead", "loss", "grad_norm",
             "timing", "load1", "before", "id", "process_started", "cpus", "cpu_model"}
TIME_SUFFIXES = ("_ms", "_s", "_j", "_fraction", "_cores", "_per_s")
# a peer's installed package versions (`extra.peer`): the host's environment, not the run's code
PEER_VERSIONS = ("version", "peft")


def _type_shape(value):
    """A value's shape: dicts keep their keys, lists the distinct shapes of their items, leaves their type."""
    if isinstance(value, dict):
        return {k: _type_shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return sorted({json.dumps(_type_shape(v), sort_keys=True) for v in value})
    return type(value).__name__


def _kept(value, key: str = ""):
    """`value` with every time- or host-dependent field reduced to its shape; floats to 6 digits."""
    if key in TIME_KEYS or key.endswith(TIME_SUFFIXES):
        return type(value).__name__
    if isinstance(value, dict):
        kept = {k: _kept(v, k) for k, v in sorted(value.items())}
        if key == "peer":
            kept.update({k: type(value[k]).__name__ for k in PEER_VERSIONS if k in value})
        return kept
    if isinstance(value, list):
        return [_kept(v, key) for v in value]
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, str) and key == "file":
        return Path(value).name  # a workload file's path depends on the checkout
    return value


def _leaves(value, prefix: str = "") -> dict[str, object]:
    """A kept record as {field path: value}: dicts are walked, anything else is one leaf."""
    if isinstance(value, dict) and value:
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


def record_shapes(run_dir: Path) -> dict:
    """The records field by field, per workload · target · phase (a run measures as many steady
    calls as their spread asks for, so the count is a time): `same` the fields every record of the
    group holds at one value, `first` the others' values in the group's first record (cumulative
    counters, a stream's index), `common` the fields every record of the run shares."""
    groups: dict[str, list[dict]] = {}
    for line in (run_dir / "results.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        key = f"{record['workload']['name']} · {record['target']} · {record['phase']}"
        groups.setdefault(key, []).append(_leaves(_kept(record)))
    every = [r for rs in groups.values() for r in rs]
    common = {k: v for k, v in every[0].items() if all(k in r and r[k] == v for r in every)}
    out = {}
    for key, records in sorted(groups.items()):
        paths = sorted(set().union(*records) - set(common))
        same = {p: records[0].get(p, "<absent>") for p in paths
                if all(r.get(p, "<absent>") == records[0].get(p, "<absent>") for r in records)}
        out[key] = {"same": same, "first": {p: records[0].get(p, "<absent>") for p in paths if p not in same}}
    return {"common": common, "groups": out}


def _key_paths(value, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (list items merged: `rows[].workload`)."""
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            out |= {f"{prefix}.{k}"} | _key_paths(v, f"{prefix}.{k}")
        return out
    if isinstance(value, list):
        return set().union(*(_key_paths(v, f"{prefix}[]") for v in value)) if value else set()
    return set()


def run_shapes(run_dir: Path) -> dict:
    """The golden file's content: the records' shapes, run.json kept as `_kept` keeps a record,
    and summary.json's key paths (its values are the run's times and what follows from them)."""
    run_json = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run_json["measured"]["ceilings"] = _type_shape(run_json["measured"].get("ceilings"))
    run_json["measured"]["harness_calibration"] = _type_shape(run_json["measured"].get("harness_calibration"))
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    return {"records": record_shapes(run_dir), "run.json": _kept(run_json),
            "summary.json": sorted(_key_paths(summary)),
            "files": sorted(p.name for p in run_dir.iterdir())}


def dumps(value, depth: int = 0) -> str:
    """JSON with one line a field (dicts are opened, a leaf's value stays on its line): small and diffable."""
    if isinstance(value, dict) and value:
        pad = " " * (depth + 1)
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dumps(v, depth + 1)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


if __name__ == "__main__":
    print(dumps(run_shapes(Path(sys.argv[1]))))
