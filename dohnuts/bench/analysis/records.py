"""The benchmark's record: one measured call, typed (`CallRecord`), versioned (`SCHEMA`), read and
written in one place each.

One record per measured call, schema 2, one JSON object a line of a run's results.jsonl
(append-only). `CallRecord` below declares every field the harness writes, in the order it writes
them; the nested Structs type each part whose shape is known:

    schema 2 · run_id · workload {name, kind, file, file_hash} · target (the label) · target_name
    (the plugin) · target_options · variant (a measurement-only variant of the product, or null) ·
    iteration · phase ("steady", "first-call", "stream", "server", "offline", "accuracy": the last
    three are analysed apart, dohnuts.bench.analysis.serving) · scenario · stages {name: {host_ms,
    device_ms, count}} · wall_ms · decisions · tokens {useful, padded, computed} · lora {rank,
    targets, merged} · work (WorkCounts.to_dict()) · model (ModelConfig.to_dict()) · model_source ·
    config_hash · precision · device {name, type} · hwspec · peak_mem_bytes · telemetry (the samples
    taken during the call) · validity {valid, reasons, detail, gpu_samples, power_capped} · energy
    {joules, source, reason, window} · extra · agreement (against the FP32 reference path) ·
    provenance · harness_overhead_ms · harness_overhead {…} · aa_half · the rank stamp {rank,
    world_size, shard}

`extra` is the one open place: what a target adds about its call (a stream's times `stream`, a
served request's `serving`, the accuracy mode's `accuracy`, a peer's fast paths `peer`, the image
cache's counters, a training step's loss) and what a plugin adds (`dohnuts_bench_after_call`).
Every top-level field is written, null where a call has none (a first call has no `aa_half`);
`agreement` and `harness_overhead` leave out their optional parts where unknown.

Writing: the runner builds a `CallRecord` (dohnuts.bench.measure.record.call_record) and
`encode_record` turns it into one strict-JSON line (msgspec; a non-finite number is null), which
dohnuts.bench.sink appends whole. Reading: `read_records` is the one reader of results files. It
never produces a wrong number: a truncated last line (a writer killed mid-append) is skipped with
a warning, records of a schema this version does not know (a newer one) are skipped with a
warning, and a corrupt line anywhere else is an error naming the file and the line — so is a line
that is not UTF-8 text, and a number that is not finite (NaN, Infinity, 1e999) anywhere in a
record. Each line is upgraded to schema 2 by `migrate` (asv's `Results` with its `api_version` is
the model), then decoded; a field out of its type or bounds is an error naming the record
(`file:line`) and the field, e.g. `results.jsonl:7: field 'stages.prefix.host_ms': is missing`.

Schema 1 (every run before issue 46) differs in three ways, all undone by `migrate`: a field a
call had no value for was left out; `target_name` and `variant` were missing in the oldest runs
(read from the target's label and options); a plugin's fields sat at the top level (now in
`extra`). `read_jsonl` gives the records as plain dicts, for scripts and tests that index them.
"""

from __future__ import annotations

import json
import warnings
import zlib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from dohnuts.bench.analysis.flops import DEFAULT_LORA_TARGETS, LoraShape
from dohnuts.config import ModelConfig, TextConfig, VisionConfig
from dohnuts.errors import DohnutsError
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import (
    MIB, NonNegative, convert, first_nonfinite, one_line_error, read_file, short, size_words,
)

SCHEMA = 2  # the record format's version: written by dohnuts.bench.measure.record, read here
READABLE_SCHEMAS = (1, 2)  # what `migrate` upgrades to SCHEMA
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
LOCATION_KEY = "_source"  # a record's "file:line" in its plain-dict form (`record_dict`)
T = TypeVar("T")


class RecordError(DohnutsError):
    """A raw result record that cannot be analysed as it is."""


class RecordWarning(UserWarning):
    """A record that was skipped (truncated last line, a schema this version does not read)."""


# A time in milliseconds: at most 10^10 ms (115 days; a run's calls are bounded by min_duration_s,
# one day), so that no sum, ratio or interval of the analysis overflows (1e308 ms once did).
MAX_MS = 1e10
Ms = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_MS)]
PositiveMs = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_MS)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Phase = Literal["steady", "first-call", "stream", "server", "offline", "accuracy"]


class StageTime(msgspec.Struct):
    """One stage of a call: host time, device time (CUDA events; null on the CPU), times entered."""

    host_ms: Ms
    device_ms: Ms | None = None
    count: Count = 1


class WorkloadRef(msgspec.Struct):
    """The workload a call belongs to: its name, kind and file (with the file's hash)."""

    name: str
    kind: str | None = None
    file: str | None = None
    file_hash: str | None = None


class Tokens(msgspec.Struct):
    """The call's tokens: useful, padding, and computed (summed over a train step's microbatches)."""

    useful: Count
    padded: Count
    computed: Count | None = None


class Device(msgspec.Struct):
    name: str
    type: str | None = None  # "cuda" or "cpu"


class LoraInfo(msgspec.Struct):
    """The adapters' shape (a target's `lora_info`); `targets` null: the default projections."""

    rank: Count
    targets: list[str] | None = None
    merged: bool = False


class Validity(msgspec.Struct):
    """dohnuts.bench.measure.telemetry.call_validity of the samples taken during the call: whether
    the GPU ran unthrottled at full clock, why not, and how many samples were power-capped."""

    valid: bool = True
    reasons: list[str] = []
    detail: list[str] = []
    gpu_samples: Count = 0
    power_capped: Count = 0


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


class Agreement(msgspec.Struct, omit_defaults=True):
    """The target's probabilities against the FP32 reference path (dohnuts.bench.measure.quality.agreement);
    the fields after `within` are written where known."""

    max_abs_gap: NonNegative
    tolerance: NonNegative
    within: bool
    requests: Count | None = None
    questions: Count | None = None
    choice_agreement: NonNegative | None = None
    agreeing_choices: Count | None = None
    reference: str | None = None
    stated_tolerance: NonNegative | None = None  # with a yardstick: the tolerance as stated
    yardstick: str | None = None
    yardstick_gap: NonNegative | None = None


class HarnessOverhead(msgspec.Struct, omit_defaults=True):
    """The harness's own time in one call (dohnuts.bench.measure.call.harness_overhead), the untimed
    twin's wall time where the call had one, and whether the stages were NVTX ranges (each part
    written where known)."""

    total_ms: Ms | None = None
    in_call_ms: Ms | None = None
    timer_ms: Ms | None = None
    timer_unaccounted_ms: Ms | None = None
    stage_entries: Count | None = None
    telemetry_ms: Ms | None = None
    record_ms: Ms | None = None
    empty_stage_ms: Ms | None = None
    empty_stage_device_ms: Ms | None = None
    untimed_twin_ms: Ms | None = None
    nvtx: bool = False


class CallRecord(msgspec.Struct, kw_only=True, dict=True):
    """One measured call (schema 2): what the harness writes, what the analysis reads. The fields
    without a default are the ones every analysis needs; `where` says which file and line a record
    read back came from."""

    schema: Literal[2] = SCHEMA
    run_id: str
    workload: WorkloadRef
    target: str  # the target's label as the workload names it
    target_name: str | None = None  # the target plugin
    target_options: dict[str, Any] = {}
    variant: str | None = None  # a measurement-only variant of the product (dohnuts.runtime.policy)
    iteration: int
    phase: Phase = "steady"
    scenario: str = "single"  # how the workload issued its calls (dohnuts.bench.measure.serving)
    stages: dict[str, StageTime]
    wall_ms: Ms
    decisions: Count | None = None
    tokens: Tokens | None = None
    lora: LoraInfo | None = None
    work: dict[str, Any]  # WorkCounts.to_dict(), read by work_of
    model: dict[str, Any]  # ModelConfig.to_dict(), read by model_of
    model_source: str | None = None
    config_hash: str | None = None
    precision: Literal["bf16", "fp32"]
    device: Device
    hwspec: str | None = None
    peak_mem_bytes: Count | None = None
    telemetry: list[dict[str, Any]] = []
    validity: Validity | None = None
    energy: Energy | None = None
    extra: dict[str, Any] = {}
    agreement: Agreement | None = None
    provenance: dict[str, Any] | None = None
    harness_overhead_ms: Ms | None = None
    harness_overhead: HarnessOverhead | None = None
    aa_half: Literal[0, 1] | None = None  # the interleaved half of a steady call (A/A noise)
    rank: Count = 0
    world_size: Annotated[int, msgspec.Meta(ge=1)] = 1
    shard: Literal["data", "collective"] | None = None


FIELDS = frozenset(CallRecord.__struct_fields__)


# -- the typed parts of `extra` (checked by check_reportable) ------------------------------------


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
    """The parts of `extra` the analysis and the reports read (other keys stay as written)."""

    stream: StreamTimes | None = None
    serving: ServingTimes | None = None
    accuracy: AccuracyCount | None = None
    peer: PeerPaths | None = None


class ReportedRecord(CallRecord, kw_only=True):
    """`CallRecord` with what the run report (dohnuts.bench.report.text_report) needs of every
    record: a positive wall time, `decisions`, `tokens`, and `extra`'s known parts typed. The
    published schema (`dohnuts-bench schema record`) is this one."""

    wall_ms: PositiveMs
    decisions: Count
    tokens: Tokens
    extra: Extra = msgspec.field(default_factory=Extra)


# -- migration -----------------------------------------------------------------------------------


def migrate(raw: dict) -> dict:
    """A parsed record of any schema this version reads, as schema 2 (a schema-2 record as it is).

    Schema 1: the target's plugin (`target_name`) and measurement-only variant (`variant`),
    missing in the oldest runs, are read from the label and the options as the analysis once read
    them; a `world_size` that is not a positive integer is left out (read as 1); a field outside
    the schema (a plugin's) moves into `extra`; a field the call had no value for takes the
    schema's default. A record without `schema` (made by hand, in a test) is read as schema 1."""
    if raw.get("schema", 1) == SCHEMA:
        return raw
    out = {k: v for k, v in raw.items() if k in FIELDS}
    extra = raw.get("extra") if isinstance(raw.get("extra"), dict) else {}
    plugin_fields = {k: v for k, v in raw.items() if k not in FIELDS and k != LOCATION_KEY}
    if plugin_fields:
        out["extra"] = plugin_fields | extra
    out["schema"] = SCHEMA
    out["variant"] = _schema1_variant(raw)
    if not isinstance(raw.get("target_name"), str):
        label = raw.get("target")
        out["target_name"] = "dohnuts" if isinstance(label, str) and label.startswith("dohnuts") else None
    if not _positive_int(raw.get("world_size")):
        out.pop("world_size", None)
    return out


def _schema1_variant(raw: dict) -> str | None:
    """A schema-1 record's variant: its `variant`, else (written before the field) the dohnuts
    target's options that made one (`share_prefix: false` → unshared, `cuda_graphs: false` → eager)."""
    v = raw.get("variant")
    if isinstance(v, str) and v:
        return v
    opts = raw.get("target_options")
    if raw.get("target_name") != "dohnuts" or not isinstance(opts, dict):
        return None
    parts = [name for name, key in (("unshared", "share_prefix"), ("eager", "cuda_graphs")) if opts.get(key) is False]
    return "+".join(parts) or None


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


# -- reading -------------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[CallRecord]:
    """The records of a results file (JSONL, or its gzip archive `.jsonl.gz`) as schema-2
    `CallRecord`s, each knowing its `file:line` (`where`)."""
    try:
        return _read_records(Path(path))
    except RecordError as exc:
        raise one_line_error(exc) from None


def record_from_dict(raw: dict, source: str | None = None) -> CallRecord:
    """One parsed record (any readable schema, `migrate`d) as a `CallRecord`; a field out of its
    type or bounds is a RecordError naming `source` (or the record's `_source`) and the field."""
    if not isinstance(raw, dict):
        raise RecordError(f"must be a JSON object, got {type(raw).__name__}", source=source or "record")
    located = raw.get(LOCATION_KEY)  # a record_dict's "file:line"
    source = source or (located if isinstance(located, str) else None)
    if raw.get("schema", 1) not in READABLE_SCHEMAS:
        raise one_line_error(RecordError(f"has schema {_schema_name(raw.get('schema'))}; this version reads "
                                         f"{', '.join(map(str, READABLE_SCHEMAS))}", source=source, field="schema"))
    rec = convert(migrate(raw), CallRecord, source=source or _fallback_where(raw), error=RecordError)
    if source:
        rec._where = source
    return rec


def record_dict(rec: CallRecord) -> dict:
    """A record as plain JSON values (what `encode_record` writes), with `_source` = where it was read."""
    return msgspec.to_builtins(rec) | {LOCATION_KEY: where(rec)}


def read_jsonl(path: str | Path) -> list[dict]:
    """`read_records` as plain dicts (`record_dict`): for a caller that indexes records by key
    (a script, a test's helper); the bench's own code reads `CallRecord`s."""
    return [record_dict(r) for r in read_records(path)]


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


def _read_records(path: Path) -> list[CallRecord]:
    out, other_schema = [], {}
    for n, raw in _parsed_lines(path):
        if raw.get("schema") not in READABLE_SCHEMAS:
            other_schema.setdefault(_schema_name(raw.get("schema")), []).append(n)
            continue
        out.append(record_from_dict(raw, f"{path}:{n}"))
    for schema, lines in other_schema.items():
        warnings.warn(f"{path}: skipped {len(lines)} record(s) of schema {schema} (this version reads "
                      f"{', '.join(map(str, READABLE_SCHEMAS))}; lines {', '.join(map(str, lines[:10]))}"
                      f"{' ...' if len(lines) > 10 else ''})", RecordWarning, stacklevel=3)
    return out


def _parsed_lines(path: Path) -> list[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line; a truncated last line is skipped with a
    warning, any other line that is not a finite JSON object is an error naming it."""
    # a regular file within the limit, checked by its stat before it is opened (a FIFO, a device, a
    # directory or an over-long name is one line)
    data = read_file(path, max_bytes=MAX_RESULTS_BYTES, error=RecordError, what="a results file")
    if path.suffix == ".gz":  # an archived run (results.jsonl.gz: committed runs stay small)
        data = _gunzip(data, MAX_RESULTS_BYTES, path)
    lines = [(n, line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    out = []
    for pos, (n, raw) in enumerate(lines):
        try:
            rec, strict = _parse_line(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if pos == len(lines) - 1:
                warnings.warn(f"{path}:{n}: skipped a truncated last line ({_reason(exc)})", RecordWarning,
                              stacklevel=4)
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
        out.append((n, rec))
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


# -- writing -------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    """A value msgspec does not encode itself, as JSON: a NumPy or torch scalar by its `item()`,
    anything else by its repr (a target's `extra` is its own)."""
    item = getattr(obj, "item", None)
    return item() if callable(item) else repr(obj)


def encode_record(rec: CallRecord) -> str:
    """One record as one strict-JSON line (no newline): every field in the schema's order, a
    non-finite number as null. The one place records become text (dohnuts.bench.sink writes it)."""
    return msgspec.json.encode(rec, enc_hook=_plain).decode()


# -- where a record came from, and what the report needs of it --------------------------------------


def where(rec: CallRecord) -> str:
    """`file:line` of a record read back, else `record RUN_ID#ITERATION`."""
    return getattr(rec, "_where", None) or f"record {_text(rec.run_id)}#{_text(rec.iteration)}"


def _fallback_where(raw: dict) -> str:
    return f"record {_text(raw.get('run_id', '?'))}#{_text(raw.get('iteration', '?'))}"


def _text(x: Any, limit: int = 40) -> str:
    """str(x) on one line, cut to `limit` characters (an error message stays readable)."""
    return short(x, limit, convert=str)


def check_reportable(rec: CallRecord) -> None:
    """What the run report (dohnuts.bench.report.text_report) needs of a record beyond the schema
    (`ReportedRecord`): a positive wall time, `decisions`, `tokens.useful` / `tokens.padded`, and a
    stream's `extra.stream` times, a peer's `extra.peer`, ... typed. RecordError names the record
    and the field, on one line."""
    convert(msgspec.to_builtins(rec), ReportedRecord, source=where(rec), error=RecordError)


# Records of load points and of the accuracy mode: analysed apart (dohnuts.bench.analysis.serving),
# never pooled into the per-call statistics of their target.
LOAD_PHASES = ("server", "offline", "accuracy")


def per_call_records(records: list[CallRecord]) -> list[CallRecord]:
    """The records the per-call analysis and summary read: all but `LOAD_PHASES`' (order kept)."""
    return [r for r in records if r.phase not in LOAD_PHASES]


def stage_ms(entry: StageTime) -> float:
    """A stage's measured time: device time when recorded (CUDA events), else host time."""
    return float(entry.device_ms if entry.device_ms is not None else entry.host_ms)


MEASUREMENT_ONLY = "measurement-only"


def target_label(rec: CallRecord) -> str:
    """The record's target as reports name it: a measurement-only variant of the product
    (`variant`) says so, in every report and comparison."""
    return rec.target + f" ({MEASUREMENT_ONLY})" if rec.variant else rec.target


def group_key(rec: CallRecord) -> tuple[str, str]:
    """(workload, target) a record is summarised under: a target's first call (`phase`
    "first-call") is its own group, never mixed with the steady-state calls; a measurement by
    several processes (`world_size` N > 1, every rank pooled) is the workload `NAME ×N`; a
    measurement-only variant of the product (`variant`) says so in its target's name, in every
    report."""
    target = target_label(rec)
    if rec.phase != "steady":
        target += f" · {rec.phase}"
    return workload_label(rec), target


def workload_label(rec: CallRecord) -> str:
    """The workload's name, with ` ×N` when N processes measured it."""
    name, n = rec.workload.name, rec.world_size
    return name if n == 1 else f"{name} ×{n}"


def extra_part(rec: CallRecord, key: str, type_: type[T]) -> T | None:
    """The record's `extra[key]` as `type_` (`StreamTimes`, `ServingTimes`, `PeerPaths`, ...), or
    None where it has none; a malformed one is a RecordError naming the field."""
    part = rec.extra.get(key)
    if part is None:
        return None
    return convert(part, type_, source=where(rec), error=RecordError, prefix=f"extra.{key}")


def peer_paths(rec: CallRecord) -> PeerPaths | None:
    """The record's `extra.peer` (`PeerPaths`), or None where it has none (the product, a peer
    recorded before the field existed)."""
    return extra_part(rec, "peer", PeerPaths)


def is_dohnuts(rec: CallRecord) -> bool:
    """A record of the dohnuts target: the product or one of its measurement-only variants."""
    return rec.target_name == "dohnuts"


def is_product(rec: CallRecord) -> bool:
    """A record of dohnuts as users run it: the dohnuts target, no measurement-only variant."""
    return is_dohnuts(rec) and not rec.variant


def work_of(rec: CallRecord) -> WorkCounts:
    try:
        return WorkCounts.from_dict(rec.work)
    except (TypeError, KeyError, AttributeError) as exc:
        raise RecordError(f"cannot be read as WorkCounts ({exc})", source=where(rec), field="work") from None


def model_of(rec: CallRecord) -> ModelConfig:
    """ModelConfig.to_dict() read back (validated by the config classes themselves)."""
    d = rec.model
    try:
        text = TextConfig(**d["text"], source=where(rec))
        vision = VisionConfig(**d["vision"], source=where(rec)) if d.get("vision") else None
        ids = {k: d[k] for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id") if k in d}
        return ModelConfig(name=d["name"], text=text, vision=vision, **ids)
    except (TypeError, KeyError) as exc:
        raise RecordError(f"cannot be read as a model config ({exc})", source=where(rec), field="model") from None


def lora_of(rec: CallRecord) -> LoraShape | None:
    """The adapters' shape: the record's `lora`, else (training calls of the built-in dohnuts
    target) its `target_options.lora_rank` with the default targets; None = unknown."""
    if rec.lora is not None:
        targets = tuple(rec.lora.targets) if rec.lora.targets is not None else DEFAULT_LORA_TARGETS
        return LoraShape(rank=rec.lora.rank, targets=targets, merged=rec.lora.merged)
    rank = rec.target_options.get("lora_rank")
    if rank is None or not rec.work.get("train"):
        return None
    try:
        rank = int(rank)
        if rank < 0:
            raise ValueError(rank)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"needs a non-negative rank ({exc})", source=where(rec),
                          field="target_options.lora_rank") from None
    return LoraShape(rank=rank, targets=DEFAULT_LORA_TARGETS)


def valid_records(records: list[CallRecord]) -> tuple[list[CallRecord], int]:
    """(the records whose call ran on an unthrottled GPU at full clock, how many were left out).

    A record is left out when its `validity.valid` is false (the runner found a throttling reason
    or a clock below the threshold in a telemetry sample taken during the call); records without
    a `validity` field (older runs, other harnesses) count as valid. Order is kept.
    """
    kept = [r for r in records if not left_out(r)]
    return kept, len(records) - len(kept)


def left_out(rec: CallRecord) -> bool:
    """Whether the validity gate left the call out (its `validity.valid` is false)."""
    return rec.validity is not None and not rec.validity.valid
