"""Raw JSONL records: reading them safely and turning their parts back into typed objects.

One record per measured call, schema 1 (the harness writes them, append-only):

    {"schema": 1, "run_id": str, "workload": {"name", "kind", "file", "file_hash"},
     "target": "dohnuts" | "transformers", "iteration": int,
     "phase": "steady" | "first-call",   # optional (steady): a target's first call is recorded apart
     "stages": {name: {"host_ms": float, "device_ms": float | null, "count": int}},
     "wall_ms": float, "decisions": int, "work": WorkCounts.to_dict(), "model": ModelConfig.to_dict(),
     "precision": "bf16" | "fp32", "device": {"name": str, "type": "cuda" | "cpu"},
     "peak_mem_bytes": int | null,
     "lora": {"rank": int, "targets": [str], "merged": bool},    # optional: the adapters' shape
     "validity": {"valid": bool, "reasons": [str], "detail": [str], "gpu_samples": int},  # optional: the gate
     "harness_overhead_ms": float,   # optional: the harness's own time in this call (breakdown in
     "harness_overhead": {...}}      #   "harness_overhead", see dohnuts.bench.runner.harness_overhead)

Reading never produces a wrong number: a truncated last line (a writer killed mid-append) is
skipped with a warning, records of another schema version are skipped with a warning, and a
corrupt line anywhere else is an error that names the file and the line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from dohnuts.bench.analysis.flops import DEFAULT_LORA_TARGETS, LoraShape
from dohnuts.config import ModelConfig, TextConfig, VisionConfig
from dohnuts.errors import DohnutsError
from dohnuts.runtime.work import WorkCounts

SCHEMA = 1
REQUIRED = ("run_id", "workload", "target", "iteration", "stages", "wall_ms", "work", "model", "precision", "device")
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
LOCATION_KEY = "_source"  # read_jsonl adds "file:line" to each record it returns


class RecordError(DohnutsError):
    """A raw result record that cannot be analysed as it is."""


class RecordWarning(UserWarning):
    """A record that was skipped (truncated last line, other schema version)."""


def read_jsonl(path: str | Path) -> list[dict]:
    """The schema-1 records of a JSONL file, each with `_source` = "file:line"."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecordError(f"cannot be read ({exc.strerror})", source=str(path)) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    out, other_schema = [], {}
    for pos, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if pos == len(lines) - 1:
                warnings.warn(f"{path}:{n}: skipped a truncated last line ({exc.msg})", RecordWarning, stacklevel=2)
                continue
            raise RecordError(f"line {n} is not valid JSON ({exc.msg} at column {exc.colno})", source=str(path),
                              field=f"line {n}") from None
        if not isinstance(rec, dict):
            raise RecordError(f"line {n} is not a JSON object", source=str(path), field=f"line {n}")
        if rec.get("schema") != SCHEMA:
            other_schema.setdefault(repr(rec.get("schema")), []).append(n)
            continue
        rec[LOCATION_KEY] = f"{path}:{n}"
        out.append(rec)
    for schema, where in other_schema.items():
        warnings.warn(f"{path}: skipped {len(where)} record(s) of schema {schema} (this version reads {SCHEMA}; "
                      f"lines {', '.join(map(str, where[:10]))}{' ...' if len(where) > 10 else ''})",
                      RecordWarning, stacklevel=2)
    return out


def where(rec: dict) -> str:
    return str(rec.get(LOCATION_KEY) or f"record {rec.get('run_id', '?')}#{rec.get('iteration', '?')}")


def check_record(rec: dict) -> None:
    """Structural checks of one schema-1 record; RecordError names the record and the field."""
    if rec.get("schema", SCHEMA) != SCHEMA:
        raise RecordError(f"has schema {rec.get('schema')!r}; this version reads {SCHEMA}", source=where(rec),
                          field="schema")
    for key in REQUIRED:
        if key not in rec:
            raise RecordError("is missing", source=where(rec), field=key)
    if not isinstance(rec["workload"], dict) or "name" not in rec["workload"]:
        raise RecordError("must be an object with a name", source=where(rec), field="workload")
    if rec["precision"] not in DTYPE_BYTES:
        raise RecordError(f"is {rec['precision']!r}; expected one of {list(DTYPE_BYTES)}", source=where(rec),
                          field="precision")
    if not isinstance(rec["stages"], dict):
        raise RecordError("must be an object of stage times", source=where(rec), field="stages")
    for name, st in rec["stages"].items():
        if not isinstance(st, dict) or not _number(st.get("host_ms")) or (
                st.get("device_ms") is not None and not _number(st["device_ms"])):
            raise RecordError("needs host_ms (and device_ms a number or null)", source=where(rec),
                              field=f"stages.{name}")
    if not _number(rec["wall_ms"]):
        raise RecordError(f"must be a non-negative number, got {rec['wall_ms']!r}", source=where(rec), field="wall_ms")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0


def stage_ms(entry: dict) -> float:
    """A stage's measured time: device time when recorded (CUDA events), else host time."""
    return float(entry["device_ms"] if entry.get("device_ms") is not None else entry["host_ms"])


def group_key(rec: dict) -> tuple[str, str]:
    """(workload, target) a record is summarised under: a target's first call (`phase`
    "first-call") is its own group, never mixed with the steady-state calls."""
    target = str(rec["target"])
    if rec.get("phase", "steady") != "steady":
        target += f" · {rec['phase']}"
    return str(rec["workload"]["name"]), target


def work_of(rec: dict) -> WorkCounts:
    try:
        return WorkCounts.from_dict(rec["work"])
    except (TypeError, KeyError, AttributeError) as exc:
        raise RecordError(f"cannot be read as WorkCounts ({exc})", source=where(rec), field="work") from None


def model_of(rec: dict) -> ModelConfig:
    """ModelConfig.to_dict() read back (validated by the config classes themselves)."""
    d = rec["model"]
    try:
        text = TextConfig(**d["text"], source=where(rec))
        vision = VisionConfig(**d["vision"], source=where(rec)) if d.get("vision") else None
        ids = {k: d[k] for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id") if k in d}
        return ModelConfig(name=d["name"], text=text, vision=vision, **ids)
    except (TypeError, KeyError) as exc:
        raise RecordError(f"cannot be read as a model config ({exc})", source=where(rec), field="model") from None


def lora_of(rec: dict) -> LoraShape | None:
    """The adapters' shape: the record's `lora` object, else (training calls of the built-in
    dohnuts target) its `target_options.lora_rank` with the default targets; None = unknown."""
    d = rec.get("lora")
    if d is None:
        rank = (rec.get("target_options") or {}).get("lora_rank")
        if rank is None or not (rec.get("work") or {}).get("train"):
            return None
        d = {"rank": rank}
    try:
        rank = int(d["rank"])
        if rank < 0:
            raise ValueError(rank)
        targets = tuple(d["targets"]) if d.get("targets") is not None else DEFAULT_LORA_TARGETS
        return LoraShape(rank=rank, targets=targets, merged=bool(d.get("merged", False)))
    except (TypeError, KeyError, ValueError) as exc:
        raise RecordError(f"needs a non-negative rank ({exc})", source=where(rec), field="lora") from None


def valid_records(records: list[dict]) -> tuple[list[dict], int]:
    """(the records whose call ran on an unthrottled GPU at full clock, how many were left out).

    A record is left out when its `validity.valid` is false (the runner found a throttling reason
    or a clock below the threshold in a telemetry sample taken during the call); records without
    a `validity` field (older runs, other harnesses) count as valid. Order is kept.
    """
    kept = [r for r in records if not _invalid(r)]
    return kept, len(records) - len(kept)


def _invalid(rec: dict) -> bool:
    validity = rec.get("validity")
    return isinstance(validity, dict) and validity.get("valid") is False


def validity_summary(records: list[dict]) -> dict[tuple[str, str], dict]:
    """Per `group_key` (workload, target): {"n", "invalid", "reasons": {reason: calls}} — how many
    calls the validity gate left out and why."""
    out: dict[tuple[str, str], dict] = {}
    for rec in records:
        g = out.setdefault(group_key(rec), {"n": 0, "invalid": 0, "reasons": {}})
        g["n"] += 1
        if _invalid(rec):
            g["invalid"] += 1
            for reason in rec["validity"].get("reasons") or ["(no reason given)"]:
                reason = str(reason)
                g["reasons"][reason] = g["reasons"].get(reason, 0) + 1
    return out


OVERHEAD_TARGET_FRACTION = 0.01  # the harness may cost at most 1 % of the measured (wall) time


def overhead_summary(records: list[dict]) -> dict[tuple[str, str], dict]:
    """Per `group_key` (workload, target), over the records that carry `harness_overhead_ms`:
    {"n", "median_ms", "median_fraction" (of wall_ms), "max_fraction", "median_in_call_ms",
    "median_in_call_fraction", "within_target"}. The in-call part (the timers' own work inside the
    measured interval) is what perturbs a measurement; the rest (telemetry lookup, building the
    record) runs between calls. `within_target`: the in-call fraction is ≤ 1 % (the total when no
    in-call figure exists). Groups without the field are left out."""
    groups: dict[tuple[str, str], list[tuple[float, float, float | None]]] = {}
    for rec in records:
        ms, wall = rec.get("harness_overhead_ms"), rec.get("wall_ms")
        if not _number(ms) or not _number(wall) or wall <= 0:
            continue
        in_call = (rec.get("harness_overhead") or {}).get("in_call_ms")
        groups.setdefault(group_key(rec), []).append((float(ms), float(ms) / float(wall),
                                                      float(in_call) if _number(in_call) else None))
    out = {}
    for key, rows in groups.items():
        fractions = [f for _, f, _ in rows]
        in_call = [c for _, _, c in rows if c is not None]
        in_call_fraction = [c * f / m for m, f, c in rows if c is not None and m > 0]
        med = _median([m for m, _, _ in rows])
        frac = _median(fractions)
        in_frac = _median(in_call_fraction) if in_call_fraction else None
        out[key] = {"n": len(rows), "median_ms": med, "median_fraction": frac, "max_fraction": max(fractions),
                    "median_in_call_ms": _median(in_call) if in_call else None,
                    "median_in_call_fraction": in_frac,
                    "within_target": (frac if in_frac is None else in_frac) <= OVERHEAD_TARGET_FRACTION}
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
