"""Raw JSONL records: reading them safely and turning their parts back into typed objects.

One record per measured call, schema 1 (the harness writes them, append-only):

    {"schema": 1, "run_id": str, "workload": {"name", "kind", "file", "file_hash"},
     "target": "dohnuts" | "transformers", "iteration": int,
     "phase": "steady" | "first-call" | "stream" | "server" | "offline" | "accuracy",  # optional (steady):
                                         # a target's first call is recorded apart; `stream` the
                                         # pipelined stream; `server` / `offline` one served request of
                                         # a load point, `accuracy` one request of the accuracy mode (these
                                         # three are analysed apart: dohnuts.bench.analysis.serving)
     "scenario": "single" | "stream" | "server" | "offline",   # optional: the workload's scenario
     "stages": {name: {"host_ms": float, "device_ms": float | null, "count": int}},
     "wall_ms": float, "decisions": int, "work": WorkCounts.to_dict(), "model": ModelConfig.to_dict(),
     "precision": "bf16" | "fp32", "device": {"name": str, "type": "cuda" | "cpu"},
     "peak_mem_bytes": int | null,
     "lora": {"rank": int, "targets": [str], "merged": bool},    # optional: the adapters' shape
     "validity": {"valid": bool, "reasons": [str], "detail": [str], "gpu_samples": int},  # optional: the gate
     "energy": {"joules": float | null, "source": "nvml" | "amdsmi" | null,   # optional: the device's
                "reason": str | null,                                           #   energy counter over the call;
                "window": {"joules", "calls", "seconds"}},                      #   steady: back-to-back calls
     "harness_overhead_ms": float,   # optional: the harness's own time in this call (breakdown in
     "harness_overhead": {...},      #   "harness_overhead", see dohnuts.bench.measure.runner.harness_overhead)
     "agreement": {"max_abs_gap", "choice_agreement", "tolerance", "within", ...} | null,  # optional:
                                     #   the target against the FP32 reference path (dohnuts.bench.measure.quality)
     "extra": {"stream": {...}, "serving": {...}, "accuracy": {...},   # optional, per phase
               "peer": {"library", "version", "paths", "fallbacks", "messages"}, ...}}  # a peer target's
                                     #   fast paths (`PeerPaths`: what the headline shows of a peer)

The schema is declared once, below, as msgspec Structs: `Record` (what the analysis reads) and
`ReportedRecord` (also what the run report reads); `SCHEMA` is the one version constant, which the
runner writes. A record carries more than the Structs name (telemetry, provenance, fields a plugin
adds): the analysis keeps reading the dict, the Structs only check it.

Reading never produces a wrong number: a truncated last line (a writer killed mid-append) is
skipped with a warning, records of another schema version are skipped with a warning, and a
corrupt line anywhere else is an error that names the file and the line — so is a line that is
not UTF-8 text, and a number that is not finite (NaN, Infinity, 1e999: never written by the
harness, whose JSON is strict) anywhere in a record. `check_record` checks what the analysis
reads, `check_reportable` also what the run report reads; their errors name the record
(`file:line`) and the field, e.g. `results.jsonl:7: field 'stages.prefix.host_ms': is missing`.
"""

from __future__ import annotations

import json
import math
import warnings
import zlib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from dohnuts.bench.analysis.flops import DEFAULT_LORA_TARGETS, LoraShape
from dohnuts.bench.analysis.quantiles import bootstrap_rng
from dohnuts.config import ModelConfig, TextConfig, VisionConfig
from dohnuts.errors import DohnutsError
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import (
    MIB, NonNegative, convert, first_nonfinite, median, one_line_error, read_file, short, size_words,
)

SCHEMA = 1  # the record format's version: written by dohnuts.bench.measure.runner, read here
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
LOCATION_KEY = "_source"  # read_jsonl adds "file:line" to each record it returns


class RecordError(DohnutsError):
    """A raw result record that cannot be analysed as it is."""


# A time in milliseconds: at most 10^10 ms (115 days; a run's calls are bounded by min_duration_s,
# one day), so that no sum, ratio or interval of the analysis overflows (1e308 ms once did).
MAX_MS = 1e10
Ms = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_MS)]
PositiveMs = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_MS)]


class StageTime(msgspec.Struct):
    host_ms: Ms
    device_ms: Ms | None = None  # CUDA events; null on the CPU


class WorkloadRef(msgspec.Struct):
    name: Any
    kind: Any = None
    file: Any = None
    file_hash: Any = None


class Timing(msgspec.Struct, kw_only=True):
    """What `compare` reads of a record: whose times (workload, target) and the times themselves."""

    workload: WorkloadRef
    target: Any
    wall_ms: Ms
    stages: dict[str, StageTime] = {}


class Record(Timing, kw_only=True):
    """What the analysis reads of a record (check_record); other fields are carried as written."""

    schema: Literal[1] = 1
    run_id: Any
    iteration: Any
    stages: dict[str, StageTime]
    work: Any  # WorkCounts.to_dict(), read by work_of
    model: Any  # ModelConfig.to_dict(), read by model_of
    precision: Literal["bf16", "fp32"]
    device: dict[str, Any]


class Tokens(msgspec.Struct):
    useful: NonNegative
    padded: NonNegative


class Device(msgspec.Struct):
    name: str
    type: Any = None


class Validity(msgspec.Struct):
    reasons: list[Any] | None = None


Count = Annotated[int, msgspec.Meta(ge=0)]


class ServedSetFacts(msgspec.Struct):
    """What a load point or stream served of its set (dohnuts.bench.measure.serving.variety.ServedFacts);
    absent from records written before it."""

    varied: bool
    set_size: Annotated[int, msgspec.Meta(ge=1)]
    requests: Count  # distinct requests of the set served
    shapes: Count  # distinct pass shapes served
    graph_captures: Count | None = None  # None: the target runs without graphs
    graph_capture_ms: Ms | None = None
    graph_eager: Count | None = None


class StreamTimes(msgspec.Struct):
    """A stream record's `extra.stream` (dohnuts.bench.measure.call.measure_stream)."""

    latency_ms: Ms
    queue_ms: Ms
    total_ms: PositiveMs
    energy_j: NonNegative | None = None  # the whole stream's energy (a request's alone is not measurable)
    served_set: ServedSetFacts | None = None


class PointFacts(msgspec.Struct):
    """A load point's facts (`extra.serving.point`): the served set typed, the rest read by the
    serving analysis as it goes (dohnuts.bench.analysis.serving)."""

    served_set: ServedSetFacts | None = None


class EnergyWindow(msgspec.Struct):
    """`energy.window` (dohnuts.bench.measure.call.energy_window): the counter over `calls` untimed
    back-to-back calls of the target lasting `seconds`, long enough for the counter's steps."""

    joules: NonNegative
    calls: Annotated[int, msgspec.Meta(ge=1)]
    seconds: Annotated[float, msgspec.Meta(gt=0.0, le=1e6)]


class Energy(msgspec.Struct):
    """A record's `energy` (dohnuts.bench.measure.telemetry.call_energy): the joules the device's energy
    counter advanced over the call, the sampler it came from, or why there are none; a steady
    call's `window` is the target's energy over a window of back-to-back calls."""

    joules: NonNegative | None = None
    source: str | None = None
    reason: str | None = None
    window: EnergyWindow | None = None


class ServingTimes(msgspec.Struct):
    """A served request's `extra.serving` (dohnuts.bench.measure.serving.scenario); a stream scenario's
    records carry only the scenario and its rules."""

    scenario: str
    latency_ms: Ms | None = None
    queue_ms: Ms | None = None
    service_ms: Ms | None = None
    point: PointFacts | None = None
    rules: dict[str, Any] | None = None


class AccuracyCount(msgspec.Struct):
    """An accuracy-mode record's `extra.accuracy` (dohnuts.bench.measure.quality)."""

    questions: NonNegative
    correct: NonNegative


class PeerPaths(msgspec.Struct, frozen=True):
    """A peer target's `extra.peer`: which implementation ran each path of the model (`paths`:
    delta_rule → "fla", conv → "causal_conv1d", ...), the paths that fell back to the library's
    slow reference code (`fallbacks`), and the library's own fallback warnings (`messages`)."""

    library: str
    version: str | None = None
    paths: dict[str, str | None] = {}
    fallbacks: list[str] = []
    messages: list[str] = []


class Extra(msgspec.Struct):
    stream: StreamTimes | None = None
    serving: ServingTimes | None = None
    accuracy: AccuracyCount | None = None
    peer: PeerPaths | None = None


class Agreement(msgspec.Struct):
    max_abs_gap: NonNegative
    tolerance: NonNegative
    within: bool


class ReportedRecord(Record, kw_only=True):
    """`Record` and what the run report (dohnuts.bench.report.text_report) reads (check_reportable)."""

    wall_ms: PositiveMs
    decisions: NonNegative
    tokens: Tokens
    device: Device
    peak_mem_bytes: NonNegative | None = None
    validity: Validity | None = None
    energy: Energy | None = None
    harness_overhead: dict[str, Any] | None = None
    extra: Extra | None = None
    aa_half: Literal[0, 1] | None = None
    agreement: Agreement | None = None


class RecordWarning(UserWarning):
    """A record that was skipped (truncated last line, other schema version)."""


def read_jsonl(path: str | Path) -> list[dict]:
    """The schema-1 records of a JSONL file (or its gzip archive, `.jsonl.gz`), each with
    `_source` = "file:line"."""
    try:
        return _read_jsonl(Path(path))
    except RecordError as exc:
        raise one_line_error(exc) from None


# What a results file may hold, read or once decompressed: tens of thousands of records (a run
# holds hundreds). A 1.5 MB archive once decompressed to 3.4 GB; it is now cut off past this.
MAX_RESULTS_BYTES = 256 * MIB


def _gunzip(raw: bytes, limit: int, path: Path) -> bytes:
    """A gzip archive (one or several members) decompressed as a stream that stops past `limit`
    bytes: a small archive cannot expand without bound (a decompression bomb)."""
    out = bytearray()
    data = raw
    while data:
        d = zlib.decompressobj(wbits=31)  # a gzip member
        buf = data
        try:
            while buf and not d.eof:
                out += d.decompress(buf, limit + 1 - len(out))
                if len(out) > limit:
                    raise RecordError(f"decompresses to more than {size_words(limit)}, the limit for a results "
                                      "file (a run holds far less; a damaged or hostile archive?)", source=str(path))
                buf = d.unconsumed_tail
        except zlib.error as exc:
            raise RecordError(f"cannot be read (a damaged gzip archive: {exc})", source=str(path)) from None
        if not d.eof:
            raise RecordError("cannot be read (a damaged gzip archive: it ends early)", source=str(path))
        data = d.unused_data
    return bytes(out)


def _read_jsonl(path: Path) -> list[dict]:
    # a regular file within the limit, checked by its stat before it is opened (a FIFO, a device, a
    # directory or an over-long name is one line)
    data = read_file(path, max_bytes=MAX_RESULTS_BYTES, error=RecordError, what="a results file")
    if path.suffix == ".gz":  # an archived run (results.jsonl.gz: committed runs stay small)
        data = _gunzip(data, MAX_RESULTS_BYTES, path)
    lines = [(n, line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    out, other_schema = [], {}
    for pos, (n, raw) in enumerate(lines):
        try:
            rec, strict = _parse_line(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if pos == len(lines) - 1:
                warnings.warn(f"{path}:{n}: skipped a truncated last line ({_reason(exc)})", RecordWarning,
                              stacklevel=2)
                continue
            raise RecordError(f"line {n} is not valid JSON ({_reason(exc)})", source=str(path),
                              field=f"line {n}") from None
        except (ValueError, RecursionError) as exc:  # an integer too long, a non-finite number, nesting
            raise RecordError(f"line {n} cannot be read ({exc})", source=str(path), field=f"line {n}") from None
        if not isinstance(rec, dict):
            raise RecordError(f"line {n} is not a JSON object", source=str(path), field=f"line {n}")
        bad = None if strict else first_nonfinite(rec)
        if bad is not None:
            raise RecordError(f"line {n} holds a number that is not finite (NaN or infinite) at {bad}",
                              source=str(path), field=f"line {n}")
        if rec.get("schema") != SCHEMA:
            other_schema.setdefault(_schema_name(rec.get("schema")), []).append(n)
            continue
        rec[LOCATION_KEY] = f"{path}:{n}"
        out.append(rec)
    for schema, where in other_schema.items():
        warnings.warn(f"{path}: skipped {len(where)} record(s) of schema {schema} (this version reads {SCHEMA}; "
                      f"lines {', '.join(map(str, where[:10]))}{' ...' if len(where) > 10 else ''})",
                      RecordWarning, stacklevel=2)
    return out


def _parse_line(raw: bytes) -> tuple[Any, bool]:
    """One line as JSON, and whether msgspec's strict decoder read it: it refuses NaN, Infinity and
    every number out of a float's range, so what it reads holds no non-finite number and needs no
    search for one (the search over every record once took most of the time `history` spent
    importing the committed runs). Where it refuses the line (a NaN token, a number out of range,
    nesting), Python's reader takes it, so the error says what and where, as it always has."""
    try:
        return msgspec.json.decode(raw), True
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return json.loads(raw.decode("utf-8")), False


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text at byte {exc.start}"
    return f"{exc.msg} at column {exc.colno}"


def _schema_name(value: Any) -> str:
    return short(value, 40)


def where(rec: dict) -> str:
    return str(rec.get(LOCATION_KEY) or f"record {_text(rec.get('run_id', '?'))}#{_text(rec.get('iteration', '?'))}")


def _text(x: Any, limit: int = 40) -> str:
    """str(x) on one line, cut to `limit` characters (an error message stays readable)."""
    return short(x, limit, convert=str)


def check_record(rec: dict) -> None:
    """Structural checks of one schema-1 record (`Record`); RecordError names the record and the
    field (on one line: a key holding a newline is written with escapes)."""
    if not isinstance(rec, dict):
        raise RecordError(f"must be a JSON object, got {type(rec).__name__}", source="record")
    if rec.get("schema", SCHEMA) != SCHEMA:
        raise one_line_error(RecordError(f"has schema {_schema_name(rec.get('schema'))}; this version reads {SCHEMA}",
                                         source=where(rec), field="schema"))
    convert(rec, Record, source=where(rec), error=RecordError)


def check_reportable(rec: dict) -> None:
    """`check_record`, and what the run report (dohnuts.bench.report.text_report) reads of a record
    (`ReportedRecord`): a positive wall time, `decisions`, `tokens.useful` / `tokens.padded`, the
    device's name, and when present `peak_mem_bytes`, `validity`, `energy`, `harness_overhead`,
    `aa_half` and a stream's `extra.stream` times. RecordError names the record and the field, on one line."""
    check_record(rec)
    convert(rec, ReportedRecord, source=where(rec), error=RecordError)


# Records of load points and of the accuracy mode: analysed apart (dohnuts.bench.analysis.serving),
# never pooled into the per-call statistics of their target.
LOAD_PHASES = ("server", "offline", "accuracy")


def per_call_records(records: list[dict]) -> list[dict]:
    """The records the per-call analysis and summary read: all but `LOAD_PHASES`' (order kept)."""
    return [r for r in records if r.get("phase", "steady") not in LOAD_PHASES]


def _number(x: Any) -> bool:
    """A finite non-negative number (not a bool)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return x >= 0 and (isinstance(x, int) or math.isfinite(x))


def stage_ms(entry: dict) -> float:
    """A stage's measured time: device time when recorded (CUDA events), else host time."""
    return float(entry["device_ms"] if entry.get("device_ms") is not None else entry["host_ms"])


MEASUREMENT_ONLY = "measurement-only"


def variant_of(rec: dict) -> str | None:
    """The measurement-only variant a record measured (dohnuts.runtime.policy: `unshared`,
    `eager`, ...), or None for the product. Records written before the field existed are read
    from the dohnuts target's options."""
    v = rec.get("variant")
    if isinstance(v, str) and v:
        return v
    opts = rec.get("target_options")
    if rec.get("target_name") != "dohnuts" or not isinstance(opts, dict):
        return None
    parts = [name for name, key in (("unshared", "share_prefix"), ("eager", "cuda_graphs")) if opts.get(key) is False]
    return "+".join(parts) or None


def target_label(rec: dict) -> str:
    """The record's target as reports name it: a measurement-only variant of the product
    (`variant_of`) says so, in every report and comparison."""
    target = str(rec["target"])
    return target + f" ({MEASUREMENT_ONLY})" if variant_of(rec) is not None else target


def group_key(rec: dict) -> tuple[str, str]:
    """(workload, target) a record is summarised under: a target's first call (`phase`
    "first-call") is its own group, never mixed with the steady-state calls; a measurement by
    several processes (`world_size` N > 1, every rank pooled) is the workload `NAME ×N`; a
    measurement-only variant of the product (`variant_of`) says so in its target's name, in every
    report."""
    target = target_label(rec)
    if rec.get("phase", "steady") != "steady":
        target += f" · {rec['phase']}"
    return workload_label(rec), target


def world_size(rec: dict) -> int:
    n = rec.get("world_size", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def workload_label(rec: dict) -> str:
    """The workload's name, with ` ×N` when N processes measured it."""
    name, n = str(rec["workload"]["name"]), world_size(rec)
    return name if n == 1 else f"{name} ×{n}"


def peer_paths(rec: dict) -> PeerPaths | None:
    """The record's `extra.peer` (`PeerPaths`), or None where it has none (the product, a peer
    recorded before the field existed); a malformed one is a RecordError naming the field."""
    peer = (rec.get("extra") or {}).get("peer") if isinstance(rec.get("extra"), dict) else None
    if peer is None:
        return None
    return convert(peer, PeerPaths, source=where(rec), error=RecordError, prefix="extra.peer")


def is_dohnuts(rec: dict) -> bool:
    """A record of the dohnuts target: the product or one of its measurement-only variants
    (`variant_of`). Records written before `target_name` existed are read from their label."""
    name = rec.get("target_name")
    return name == "dohnuts" if isinstance(name, str) else str(rec.get("target", "")).startswith("dohnuts")


def is_product(rec: dict) -> bool:
    """A record of dohnuts as users run it: the dohnuts target, no measurement-only variant."""
    return is_dohnuts(rec) and variant_of(rec) is None


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
    """Per `group_key` (workload, target): {"n", "invalid", "reasons": {reason: calls},
    "power_capped"} — how many calls the validity gate left out and why, and how many ran (and
    were kept) at the device's power limit."""
    out: dict[tuple[str, str], dict] = {}
    for rec in records:
        g = out.setdefault(group_key(rec), {"n": 0, "invalid": 0, "reasons": {}, "power_capped": 0})
        g["n"] += 1
        validity = rec.get("validity")
        if isinstance(validity, dict) and validity.get("power_capped"):
            g["power_capped"] += 1
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
    "median_in_call_fraction", "ab", "within_target", "basis", "host_bound"}.

    Two figures. The self-measured one: the timer's own host time inside the measured interval
    (`in_call`; the rest, telemetry lookup and building the record, runs between calls). On the
    CPU that host time is the call's time; on a GPU the host usually runs ahead of the device and
    hides it, so there it is only an upper bound. The figure from outside (`ab`): the records
    whose call followed an untimed twin (`harness_overhead.untimed_twin_ms`, the same call with no
    timer), paired: {"pairs", "median_ms" (of timed − untimed), "fraction" (of the untimed median),
    "low", "high" (95 % bootstrap interval of that fraction)}.

    `within_target` (≤ 1 % of the call) decides the report's warning, on the evidence that holds
    (`basis`): on the CPU the in-call figure (the timer's host work is the call's time there, and
    measured far more precisely than a difference of two noisy walls); on a GPU the A/B where it
    has ≥ 5 pairs — over the target only when its whole interval is; a GPU without an A/B claims
    nothing: True, with `basis` "upper bound". `host_bound`: the in-call figure is only an upper
    bound (a GPU). `nvtx` (present when true): the calls carried NVTX stage ranges (`run --nvtx`),
    whose cost both figures include. Groups without the field are left out."""
    groups: dict[tuple[str, str], list[tuple[float, float, float | None, float | None, str]]] = {}
    with_ranges: set[tuple[str, str]] = set()  # groups measured with NVTX stage ranges (`run --nvtx`)
    for rec in records:
        ms, wall = rec.get("harness_overhead_ms"), rec.get("wall_ms")
        if not _number(ms) or not _number(wall) or wall <= 0:
            continue
        detail = rec.get("harness_overhead") or {}
        in_call, twin = detail.get("in_call_ms"), detail.get("untimed_twin_ms")
        if detail.get("nvtx") is True:
            with_ranges.add(group_key(rec))
        device = (rec.get("device") or {}).get("type", "cpu") if isinstance(rec.get("device"), dict) else "cpu"
        groups.setdefault(group_key(rec), []).append((
            float(ms), float(wall), float(in_call) if _number(in_call) else None,
            float(twin) if _number(twin) and twin > 0 else None, str(device)))
    out = {}
    for key, rows in groups.items():
        fractions = [m / w for m, w, _, _, _ in rows]
        in_call = [c for _, _, c, _, _ in rows if c is not None]
        in_call_fraction = [c / w for _, w, c, _, _ in rows if c is not None]
        in_frac = median(in_call_fraction) if in_call_fraction else None
        ab = _paired_overhead([(w, t) for _, w, _, t, _ in rows if t is not None])
        on_cpu = all(d == "cpu" for *_, d in rows)
        if on_cpu:
            within = (median(fractions) if in_frac is None else in_frac) <= OVERHEAD_TARGET_FRACTION
            basis = "in call"
        elif ab is not None:
            within, basis = ab["low"] <= OVERHEAD_TARGET_FRACTION, "A/B"
        else:
            within, basis = True, "upper bound"
        out[key] = {"n": len(rows), "median_ms": median([m for m, *_ in rows]), "median_fraction": median(fractions),
                    "max_fraction": max(fractions), "median_in_call_ms": median(in_call) if in_call else None,
                    "median_in_call_fraction": in_frac, "ab": ab, "within_target": within, "basis": basis,
                    "host_bound": not on_cpu}
        if key in with_ranges:
            out[key]["nvtx"] = True
    return out


def gap_words(agreement: dict) -> str:
    """'probabilities 0.12 apart (tolerance 0.05; BF16 plain ops 0.03 apart)' for the reports."""
    words = f"probabilities {agreement['max_abs_gap']:.3g} apart (tolerance {agreement['tolerance']:.3g}"
    if agreement.get("yardstick_gap") is not None:
        words += f"; the same mathematics in plain ops at this precision: {agreement['yardstick_gap']:.3g} apart"
    return words + ")"


def overhead_text(o: dict | None) -> str:
    """The harness overhead as the report prints it: the A/B from outside where the run has one
    (with its interval), the self-measured in-call time beside it — labelled an upper bound where
    the host can run ahead of the device; "NVTX ranges on" where the calls carried them."""
    if not o:
        return "—"
    text = _overhead_figures(o)
    return f"{text}; NVTX ranges on" if o.get("nvtx") else text


def _overhead_figures(o: dict) -> str:
    inside = ""
    if o.get("median_in_call_fraction") is not None:
        bound = "≤ " if o.get("host_bound") else ""
        inside = f"{bound}{o['median_in_call_ms']:.3f} ms in call ({100 * o['median_in_call_fraction']:.2f}%)"
    ab = o.get("ab")
    if ab:
        ab_text = (f"A/B {100 * ab['fraction']:+.2f}% ({100 * ab['low']:+.2f}…{100 * ab['high']:+.2f}%, "
                   f"{ab['pairs']} pairs)")
        if o.get("basis") == "in call" and inside:  # the CPU: the self-measure is the precise figure
            return f"{inside}; {ab_text}"
        return ab_text + (f"; self-measured {inside}" if inside else "")
    if inside:
        return inside + (" (upper bound)" if o.get("basis") == "upper bound" else "") + f", {o['median_ms']:.2f} ms in all"
    return f"{o['median_ms']:.2f} ms ({100 * o['median_fraction']:.2f}%)"


AB_MIN_PAIRS = 5


def _paired_overhead(pairs: list[tuple[float, float]], confidence: float = 0.95, resamples: int = 2000) -> dict | None:
    """The timer's cost from (timed wall, untimed wall) pairs of the same call: the median paired
    difference as a fraction of the untimed median, with its percentile bootstrap interval
    (`scipy.stats.bootstrap` over the differences, the untimed median held fixed; seeded)."""
    if len(pairs) < AB_MIN_PAIRS:
        return None
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import stats


    timed = np.array([t for t, _ in pairs])
    untimed = np.array([u for _, u in pairs])
    base = float(np.median(untimed))
    if base <= 0:
        return None
    diff = timed - untimed
    boot = stats.bootstrap((diff,), lambda x, axis=-1: np.median(x, axis=axis) / base, n_resamples=resamples,
                           method="percentile", confidence_level=confidence, vectorized=True, **bootstrap_rng([0]))
    low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    med = float(np.median(diff))
    return {"pairs": len(pairs), "median_ms": med, "fraction": med / base, "low": low, "high": high}


def quality_cells(r: dict) -> tuple[str, str, str, str, str]:
    """A summary row's measurement quality as both reports write it (report.txt's quality table,
    report.html's): calls left out (and power-capped calls kept), the GPU clock, the A/A noise, the
    harness's overhead, and the note — the spread too large for the claimed precision, or the
    harness overhead above 1 %."""
    o = r.get("harness_overhead")
    over = overhead_text(o)
    aa = "—" if r.get("aa_noise_halfwidth") is None else f"{100 * r['aa_noise_halfwidth']:.1f}%"
    excluded = str(r.get("excluded_calls", 0))
    if r.get("excluded_calls"):
        excluded += " (" + ", ".join(f"{k}: {v}" for k, v in (r.get("excluded_reasons") or {}).items()) + ")"
    if r.get("power_capped_calls"):
        excluded += f"; {r['power_capped_calls']} power-capped, kept"
    note = r.get("spread_warning") or (f"harness overhead above 1 % ({o['basis']})" if o and not o["within_target"]
                                       else "")
    c = r.get("gpu_clock")
    clock = "—" if not c else (f"{c['median_mhz']:.0f} ({c['min_mhz']:.0f})"
                               + (f" / {c['max_mhz']:.0f}" if c["max_mhz"] else ""))
    return excluded, clock, aa, over, note or ""
