"""train-step updates of code variants taking turns, each variant in several equal copies: the A/B a
training lever is judged by, with the A/A spread beside it that says whether the lease is quiet
enough to judge it (docs/history/evolution.md M60, M61).

Every copy is a model of one seed with its own Updater — its own CUDA graphs, captured under its
variant — and every update runs inside its variant's patch (`Variant.enter`/`exit`: swap in the code
the variant stands for, put main's back). Updates are CUDA-synchronised wall times, taken in rounds;
each round visits every copy in an order rotated by one from the round before, `per_round` updates
a visit. The report gives each copy's median and round medians, each variant's pooled median, its
A/A spread (the largest difference between its copies' medians) and its difference from the first
variant with whether it held in every round — the reading M61 trusted only where the spread sat
well below the difference (its call 8: a lease where every copy's rounds moved 363–410 ms).

A scratch script imports it and names its variants; run alone it is an A/A of main (two
variants, both main's code): the noise floor of this lease.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/update_ab.py OUT.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """A version of the code: `enter` swaps it in (a monkeypatch), `exit` restores main's."""

    name: str
    enter: Callable[[], None] = field(default=lambda: None)
    exit: Callable[[], None] = field(default=lambda: None)


def schedule(copies: list[str], rounds: int) -> list[list[str]]:
    """The visiting order of each round: the copies in order, rotated by one more each round."""
    n = len(copies)
    return [copies[r % n:] + copies[:r % n] for r in range(rounds)] if n else [[] for _ in range(rounds)]


def copy_names(variants: list[str], copies: int) -> dict[str, str]:
    """copy name → its variant: `name` for the first copy, `name (2)`, `name (3)` … after it."""
    return {(v if i == 0 else f"{v} ({i + 1})"): v for i in range(copies) for v in variants}


def summarize(times: dict[str, list[float]], variant_of: dict[str, str], per_round: int) -> dict:
    """The report of `run` from each copy's update times (ms, in the order taken: `per_round` a
    round). Variants in the order of their first copy; the first is the baseline."""
    def stats(v: list[float]) -> dict:
        rounds = [statistics.median(v[i:i + per_round]) for i in range(0, len(v), per_round)]
        return {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2),
                "round_medians": [round(x, 2) for x in rounds]}

    per_copy = {c: stats(v) for c, v in times.items()}
    order = list(dict.fromkeys(variant_of[c] for c in times))
    out: dict = {"copies": per_copy, "variants": {}}
    base = order[0] if order else None
    for v in order:
        mine = [c for c in times if variant_of[c] == v]
        medians = [per_copy[c]["median"] for c in mine]
        entry = {"median": round(statistics.median([t for c in mine for t in times[c]]), 2),
                 "aa_spread_ms": round(max(medians) - min(medians), 2)}
        if v != base:
            theirs = [c for c in times if variant_of[c] == base]
            entry["against_first_ms"] = round(entry["median"] - out["variants"][base]["median"], 2)
            rounds = len(per_copy[mine[0]]["round_medians"])
            faster = [max(per_copy[c]["round_medians"][r] for c in mine)
                      < min(per_copy[c]["round_medians"][r] for c in theirs) for r in range(rounds)]
            slower = [min(per_copy[c]["round_medians"][r] for c in mine)
                      > max(per_copy[c]["round_medians"][r] for c in theirs) for r in range(rounds)]
            entry["every_round"] = "faster" if all(faster) else "slower" if all(slower) else "mixed"
        out["variants"][v] = entry
    return out


def run(variants: list[Variant], *, copies: int = 2, rounds: int = 4, per_round: int = 4, warmup: int = 3,
        workload: str = "workloads/gpu/train-step-2b.yaml", lora_rank: int = 16) -> dict:
    """`copies` models of each variant, `warmup` updates each (captures, autotuning) then `rounds`
    rounds; on a machine without a GPU the CPU workload on the tiny preset (a dry run)."""
    import torch

    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model import lora as L
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    gpu = torch.cuda.is_available()
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(workload if gpu else "workloads/train-step.yaml", kinds, targets, gpu=gpu)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    by_name = {v.name: v for v in variants}
    variant_of = copy_names([v.name for v in variants], copies)
    updaters = {}
    for c in variant_of:
        model = api.load(spec.model, device="cuda" if gpu else "cpu", seed=spec.seed, lora=L.LoRAConfig(rank=lora_rank))
        optim = OptimConfig()
        updaters[c] = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)

    def update(c: str, i: int):
        v = by_name[variant_of[c]]
        v.enter()
        try:
            sync()
            t0 = time.perf_counter()
            res = updaters[c].update(calls[i % len(calls)].requests)
            sync()
            return (time.perf_counter() - t0) * 1e3, res
        finally:
            v.exit()

    first = {}
    for c in variant_of:
        _, res = update(c, 0)
        first[c] = {"loss": float(res.loss), "grad_norm": float(res.grad_norm)}
        for i in range(1, warmup):
            update(c, i)
    times: dict[str, list[float]] = {c: [] for c in variant_of}
    for r, order in enumerate(schedule(list(variant_of), rounds)):
        for c in order:
            for i in range(per_round):
                times[c].append(update(c, warmup + r * per_round + i)[0])
    return {"gpu": torch.cuda.get_device_name(0) if gpu else "cpu", "workload": spec.name, "first": first,
            **summarize(times, variant_of, per_round)}


if __name__ == "__main__":
    report = run([Variant("main"), Variant("main again")])
    print(json.dumps(report["variants"]), flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
