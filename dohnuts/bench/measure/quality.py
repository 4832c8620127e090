"""Quality in the same run as speed: the accuracy mode and the reference check.

Reference check (every target whose factory has `reference_options`: the dohnuts product and its
measurement-only variants). Before a workload's targets are built, its FP32 reference path —
the factory's reference options (no sharing, eager), built at FP32 and run inside
`dohnuts.ops._dispatch.reference()` (the plain-torch ops), over the same weights and adapter — scores the
workload's first `agreement.sample` requests. After each target's warm-up the target scores the
same requests, and its records carry `agreement`: the largest absolute gap between its
probabilities and the reference's, the share of questions where both chose the same candidate,
and the stated tolerance (`agreement.tolerance`; default 1e-4 at FP32, 0.05 at BF16).
`within: false` flags every performance record of that target: a faster wrong kernel is visible
where its speed is reported.

Accuracy mode (`accuracy:` in the workload): after its measured calls and scenario, every target
scores a labelled request set once — `digits` (scikit-learn's handwritten digits, written into
the run's inputs folder with `dohnuts.train.digits` at its default seed, so the split is the one
`python -m dohnuts.train.digits DIR` writes and a trained adapter was selected without its test
part) or a labelled request file. One record a request, `phase: accuracy`, with
`extra.accuracy`: questions, correct (the choice is the best-rewarded candidate, the trainer's
rule), choices and answers. A target that cannot run the set (an image set for a text-only
target) or reports no output is skipped, with the reason said.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from dohnuts.bench.analysis.measurement_quality import gap_words
from dohnuts.bench.calls import PredictCall
from dohnuts.bench.measure.record import CallMeasurement, TargetContext, call_record, stages_dict, stamped
from dohnuts.bench.measure.telemetry import call_energy
from dohnuts.bench.report.status import log
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.ops._dispatch import reference
from dohnuts.runtime.requests import Request, read_requests, require_rewards
from dohnuts.runtime.timing import NULL_TIMER, StageTimer
from dohnuts.train.digits import write_digits

REFERENCE = "FP32, plain-torch ops, no sharing, eager"
# At a lower precision the same path at that precision is the yardstick: its own gap to the FP32
# reference is the rounding error of the mathematics without our kernels (on random-weight presets
# that can exceed any fixed tolerance). A target within YARDSTICK_FACTOR of it is as right as the
# mathematics at that precision can be, whatever the stated tolerance.
YARDSTICK = "plain-torch ops, no sharing, eager, at the target's precision"
YARDSTICK_FACTOR = 1.5


def sample_calls(calls: list, n: int) -> list[PredictCall]:
    """The reference check's fixed sample: the workload's first `n` prediction calls."""
    return [c for c in calls if isinstance(c, PredictCall)][:n]


def reference_outputs(spec, entry, tspec, device: torch.device, calls: list[PredictCall],
                      dtype: torch.dtype = torch.float32) -> list:
    """The reference path's outputs (RequestResults) for `calls`, for target entry `tspec`: FP32,
    or at `dtype` for the yardstick."""
    options = entry.reference_options(entry.options(tspec.options, source=spec.file))
    with reference():
        target, _ = entry.build(spec, device, dtype, options)
        try:
            outputs = [target.run_call(c, NULL_TIMER).output for c in calls]
        finally:
            target.close()
            del target
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return outputs


def reference_key(entry, tspec, spec) -> str:
    """Targets whose reference options are equal share one reference run."""
    return f"{entry.name}:{entry.reference_options(entry.options(tspec.options, source=spec.file))!r}"


def _max_gap(outputs: list, reference: list) -> tuple[float, int, int]:
    gap, agree, questions = 0.0, 0, 0
    for got, ref in zip(outputs, reference):
        for q, r in zip(got.questions, ref.questions):
            questions += 1
            agree += int(q.choice == r.choice)
            gap = max(gap, max((abs(a - b) for a, b in zip(q.probabilities, r.probabilities)), default=0.0))
    return gap, agree, questions


def agreement(outputs: list, reference: list, tolerance: float, yardstick: list | None = None) -> dict:
    """The target's probabilities against the reference's, question by question. With a
    `yardstick` (the reference path at the target's precision), the tolerance applied is the
    stated one or YARDSTICK_FACTOR × the yardstick's own gap, whichever is larger."""
    gap, agree, questions = _max_gap(outputs, reference)
    out = {"requests": len(reference), "questions": questions, "max_abs_gap": gap,
           "choice_agreement": agree / questions if questions else None, "agreeing_choices": agree,
           "tolerance": tolerance, "reference": REFERENCE}
    if yardstick is not None:
        yard_gap = _max_gap(yardstick, reference)[0]
        out |= {"stated_tolerance": tolerance, "yardstick": YARDSTICK, "yardstick_gap": yard_gap,
                "tolerance": max(tolerance, YARDSTICK_FACTOR * yard_gap)}
    return out | {"within": gap <= out["tolerance"]}


def check_agreement(ctx: TargetContext, target, calls: list[PredictCall], reference: list,
                    yardstick: list | None = None) -> dict | None:
    """The target's outputs on the sample against the reference's (None: it reports no output)."""
    outputs = [target.run_call(c, NULL_TIMER).output for c in calls]
    if any(o is None for o in outputs):
        return None
    result = agreement(outputs, reference, ctx.spec.agreement.tolerance_for(_precision(ctx.dtype)), yardstick)
    if not result["within"]:
        log.warning("%s · %s DISAGREES with the FP32 reference: %s; its records are flagged",
                    ctx.spec.name, ctx.target.label, gap_words(result))
    return result


def _precision(dtype: torch.dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


# -- accuracy mode -------------------------------------------------------------------------------


def labelled_set(spec, workdir: Path) -> tuple[str, list[Request]]:
    """(its name, the requests) of the workload's `accuracy` set, every question labelled."""
    acc = spec.accuracy
    return request_set(acc.set, acc.split, acc.limit, workdir, labelled=True, source=spec.file,
                       field="accuracy.set")


def request_set(which: str, split: str, limit: int, workdir: Path, *, labelled: bool, source: str,
                field: str) -> tuple[str, list[Request]]:
    """(a name, the requests) of `digits` (its `split`, written under `workdir/digits` once) or a
    request file (a path: absolute, or relative to the folder of the workload file `source`);
    at most `limit` (0: all). `labelled`: every question must carry an answer or rewards."""
    if which == "digits":

        folder = workdir / "digits"
        if not (folder / f"{split}.jsonl").is_file():
            write_digits(folder, seed=0)
        path, name = folder / f"{split}.jsonl", f"digits:{split}"
    else:
        path = Path(which)
        if not path.is_absolute():
            path = Path(source).parent / path
        name = path.name
    requests = []
    for line, req in read_requests(path):
        if isinstance(req, DohnutsError):
            raise ConfigError(f"a request of {path} cannot be read ({req})", source=source, field=field)
        if labelled:
            require_rewards(req, source=f"{path}:{line}")
        requests.append(req)
        if limit and len(requests) >= limit:
            break
    if not requests:
        raise ConfigError(f"{path} holds no request", source=source, field=field)
    return name, requests


def can_score(entry, requests: list[Request]) -> str | None:
    """Why a target cannot score the set (None: it can): images for a text-only target."""
    if entry.kinds is not None and any(r.image for r in requests) and not {"image", "image-cache"} & set(entry.kinds):
        return f"the set has images and target {entry.name!r} runs {', '.join(entry.kinds)} workloads only"
    return None


def best_answer(question) -> int:
    """The best-rewarded candidate (the first of equals), as the trainer's evaluation counts it."""
    return max(range(len(question.rewards)), key=lambda i: question.rewards[i])


def measure_accuracy(ctx: TargetContext, target, name: str, requests: list[Request], out) -> int:
    """Score every request of the set once (module docstring); returns the records written."""
    device = ctx.device
    records = []
    t_start = time.perf_counter()
    for j, req in enumerate(requests):
        timer = StageTimer(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        e0 = ctx.telemetry.energy()
        t0 = time.perf_counter()
        result = target.run_call(PredictCall(req), timer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        energy = call_energy(e0, ctx.telemetry.energy())
        if result.output is None:
            log.warning("skipped accuracy of %s · %s: the target reports no output", ctx.spec.name,
                        ctx.target.label)
            return 0
        choices = [q.choice for q in result.output.questions]
        answers = [best_answer(q) for q in req.questions]
        correct = sum(int(c == a) for c, a in zip(choices, answers))
        records.append((j, stages_dict(timer), (t1 - t0) * 1e3, result, energy,
                        {"accuracy": {"set": name, "request": req.id, "questions": len(answers), "correct": correct,
                                      "choices": choices, "answers": answers}}))
    window, validity = ctx.telemetry.window_and_validity(t_start, time.perf_counter())
    for j, stages, wall, result, energy, extra in records:
        out.write(stamped(call_record(ctx, CallMeasurement(
            iteration=j, phase="accuracy", stages=stages, wall_ms=max(wall, 1e-6), decisions=result.decisions,
            work=result.work, window=window if j == 0 else [], validity=validity, energy=energy,
            extra=extra)), ctx.ranks))
    right = sum(e["accuracy"]["correct"] for *_, e in records)
    total = sum(e["accuracy"]["questions"] for *_, e in records)
    log.info("%s · %s: accuracy on %s %d/%d = %.3f", ctx.spec.name, ctx.target.label, name, right, total,
             right / total)
    return len(records)
