"""One measured call as a record (`CallRecord`, schema: dohnuts.bench.analysis.records).

`TargetContext` holds what every record of one target of one workload shares (the run, the
workload, the target entry, device and precision, the model, provenance, the telemetry, the rank
stamp); `CallMeasurement` what one call or one streamed request measured; `call_record` joins
them into the typed record the sink writes (dohnuts.bench.sink).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from dohnuts.bench.analysis.records import (
    Agreement, CallRecord, Device, Energy, EnergyWindow, LoraInfo, StageTime, Tokens, Validity, WorkloadRef,
)

if TYPE_CHECKING:
    from dohnuts.bench.contracts import RunContext
    from dohnuts.bench.measure.telemetry import TelemetryThread
    from dohnuts.bench.measure.workload import TargetSpec, WorkloadSpec
    from dohnuts.runtime.timing import NvtxRanges, StageTimer



@dataclass(frozen=True)
class TargetContext:
    """What every record of one target of one workload shares."""

    run: RunContext
    spec: WorkloadSpec
    target: TargetSpec  # the workload's target entry: name, label, options as written
    device: torch.device
    dtype: torch.dtype
    model_cfg: Any  # dohnuts.config.ModelConfig
    provenance: dict
    telemetry: TelemetryThread
    ranks: dict  # {"rank", "world_size", "shard"}: stamped on every record
    variant: str | None = None  # the built target's `variant` (TargetCapabilities)
    lora: dict | None = None  # the built target's `lora_info`
    # the target's probabilities against the FP32 reference path (dohnuts.bench.measure.quality), written to
    # every record measured after the check; None: not checked
    agreement: dict | None = None
    # the device's energy over back-to-back calls of this target (dohnuts.bench.measure.call
    # .energy_window), written into every steady record's `energy.window`; None: no counter
    energy_window: dict | None = None
    # `run --nvtx`: the steady calls' stages as NVTX ranges (dohnuts.bench.measure.trace.nvtx_stage_ranges); None: none
    stage_ranges: NvtxRanges | None = None


@dataclass(frozen=True)
class CallMeasurement:
    """What one call (or one request of a stream) measured."""

    iteration: int
    phase: str  # "steady", "first-call", "stream", "server", "offline" or "accuracy"
    stages: dict[str, StageTime]
    wall_ms: float
    decisions: int
    work: Any  # dohnuts.runtime.work.WorkCounts
    window: list  # the telemetry samples taken during the call
    validity: dict  # dohnuts.bench.measure.telemetry.call_validity of those samples
    energy: dict  # dohnuts.bench.measure.telemetry.call_energy: {"joules", "source", "reason"}
    extra: dict


def stages_dict(timer: StageTimer) -> dict[str, StageTime]:
    return {name: StageTime(host_ms=st.host_ms, device_ms=st.device_ms, count=st.count)
            for name, st in timer.result().items()}


@functools.lru_cache(maxsize=16)
def _model_facts(cfg) -> tuple[dict, str]:
    """(config dict, config hash) of a model config, computed once: every record carries both,
    and building them per call was most of the harness's own time on short calls."""
    return cfg.to_dict(), cfg.config_hash()


def call_record(ctx: TargetContext, m: CallMeasurement) -> CallRecord:
    """One call's record (schema: dohnuts.bench.analysis.records), without the rank stamp."""
    spec, device = ctx.spec, ctx.device
    window = ctx.energy_window if m.phase == "steady" else None
    return CallRecord(
        run_id=ctx.run.run_id,
        workload=WorkloadRef(name=spec.name, kind=spec.kind, file=spec.file, file_hash=spec.file_hash),
        target=ctx.target.label,
        target_name=ctx.target.name,
        target_options=ctx.target.options,
        variant=ctx.variant,  # a measurement-only variant of the product (dohnuts.runtime.policy), or None
        iteration=m.iteration,
        phase=m.phase,
        scenario=getattr(spec, "scenario", "single"),  # how the workload issued its calls (measure.serving)
        stages=m.stages,
        wall_ms=m.wall_ms,
        decisions=m.decisions,
        tokens=Tokens(**token_totals(m.work)),
        lora=msgspec.convert(ctx.lora, LoraInfo) if ctx.lora is not None else None,  # (a plugin's dict)
        work=m.work.to_dict(),
        model=_model_facts(ctx.model_cfg)[0],
        model_source=spec.model,
        config_hash=_model_facts(ctx.model_cfg)[1],
        precision="bf16" if ctx.dtype == torch.bfloat16 else "fp32",
        device=Device(name=ctx.provenance["device"]["name"], type=device.type),
        hwspec=ctx.run.hwspec.name if ctx.run.hwspec is not None else None,
        peak_mem_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        telemetry=m.window,
        validity=Validity(**m.validity),
        energy=Energy(**m.energy, window=EnergyWindow(**window) if window else None),
        extra=m.extra,
        agreement=Agreement(**ctx.agreement) if ctx.agreement is not None else None,
        provenance=ctx.provenance,
    )


def stamped(record: CallRecord, ranks: dict) -> CallRecord:
    """`record` with the rank stamp (`TargetContext.ranks`: rank, world_size, shard)."""
    return msgspec.structs.replace(record, **ranks)


def token_totals(work) -> dict:
    """Useful / padded / computed tokens of a call (summed over microbatches for a train step)."""
    parts = work.passes()
    return {"useful": sum(w.useful_tokens for w in parts), "padded": sum(w.padded_tokens for w in parts),
            "computed": sum(w.computed_tokens for w in parts)}
