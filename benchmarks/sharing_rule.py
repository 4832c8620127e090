"""The measurements behind the sharing rule (dohnuts.runtime.plan: a 64-token split, and sharing
only when it saves MIN_SAVED_TOKENS tokens or more).

    python benchmarks/sharing_rule.py --preset qwen3.5-2b --out sharing_rule.json

1. Grid: for B questions sharing P tokens, followed by S tokens of their own, a whole prediction
   call (`Predictor.call`: prepare, transfer, the pass — a CUDA-graph replay on a GPU — scores,
   serialization) planned with the prefix shared (the product) and without (the measurement-only
   `UNSHARED` variant), interleaved, median of --calls each. The saved dense work is (B − 1) · P
   tokens; the rule's threshold is where sharing stops losing.
2. Alignment: the product's split (a multiple of 64) against the split an 8-token grid would
   give, on the image requests of `workloads/gpu/image-cache-warm-2b.yaml` (warm cache) and the
   requests of `workloads/gpu/shared-prefix-2b.yaml` — the 8-token variant exists only in this
   script (the planner's constant is patched here, for the comparison, and restored).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path


def _timed(pred, req, device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    pred.call(req)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def _ab(session, reqs, variants, calls: int) -> dict:
    """Median ms of a whole call per variant (name → context manager factory), interleaved."""
    from dohnuts.runtime.predict import Predictor

    pred = Predictor(session)
    times = {name: [] for name in variants}
    try:
        for name, ctx in variants.items():  # warm-up: graph capture, autotuning, cache fills
            with ctx():
                for r in reqs[:2]:
                    pred.call(r)
        for i in range(calls):
            for name, ctx in variants.items():
                with ctx():
                    times[name].append(_timed(pred, reqs[i % len(reqs)], session.device))
    finally:
        pred.close()
    return {name: statistics.median(t) for name, t in times.items()}


def _policy(session, policy):
    from contextlib import contextmanager

    @contextmanager
    def ctx():
        saved = session._policy
        session._policy = policy
        try:
            yield
        finally:
            session._policy = saved

    return ctx


def _planner(**constants):
    """The planner with some of its constants changed inside the block (this script's variants)."""
    from contextlib import contextmanager

    import dohnuts.runtime.plan as plan

    @contextmanager
    def ctx():
        saved = {k: getattr(plan, k) for k in constants}
        for k, v in constants.items():
            setattr(plan, k, v)
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(plan, k, v)

    return ctx


def grid_requests(B: int, P: int, S: int, seed: int, n: int = 2):
    """n requests of B questions sharing exactly P tokens (the byte tokenizer: a prefix of P − 11
    characters, then "\\n", then "Question: " and texts that differ in their first character),
    each question P + S tokens long."""
    from dohnuts.runtime.requests import Question, Request

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for r in range(n):
        prefix = "".join(rng.choice(letters) for _ in range(P - 11))
        qs = []
        for q in range(B):
            # S tokens after the prefix: "Question: " (10, counted in P above: 11 − 1 for "\n"),
            # text, "\n", 4 candidates "Answer: xx" + SCORE (11 each)
            text = letters[q % 26] + "".join(rng.choice(letters) for _ in range(max(0, S - 46)))
            qs.append(Question(f"q{q}", text, tuple(rng.choice(letters) * 2 for _ in range(4))))
        out.append(Request(id=f"g{B}-{P}-{r}", questions=tuple(qs), prefix=prefix))
    return out


def workload_requests(path: str, tmp: Path, tokenizer, cfg):
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(path, kinds, targets, gpu=True)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer, cfg, tmp, random.Random(spec.seed)))
    return [c.request for c in calls]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3.5-2b")
    p.add_argument("--batches", default="2,4,8,16,32")
    p.add_argument("--prefixes", default="64,128,256,448")
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--out", default="sharing_rule.json")
    a = p.parse_args(argv)

    import dohnuts
    from dohnuts.runtime.policy import UNSHARED

    session = dohnuts.load(a.preset)
    out = {"preset": a.preset, "device": str(session.device), "suffix": a.suffix, "calls": a.calls, "grid": [],
           "alignment": []}
    if session.device.type == "cuda":
        import torch

        out["device_name"] = torch.cuda.get_device_name(session.device)
    # "shared": the prefix computed once whatever the threshold says (MIN_SAVED_TOKENS = 0 here)
    variants = {"shared": _planner(MIN_SAVED_TOKENS=0), "unshared": _policy(session, UNSHARED)}
    for B in map(int, a.batches.split(",")):
        for P in map(int, a.prefixes.split(",")):
            reqs = grid_requests(B, P, a.suffix, seed=B * 1000 + P)
            with variants["shared"]():
                split = session.prepare(reqs[0]).plan.prefix_len
            rule = session.prepare(reqs[0]).plan.prefix_len > 0  # what the product's rule decides
            t = _ab(session, reqs, variants, a.calls)
            row = {"B": B, "P": P, "split": split, "saved_tokens": (B - 1) * split, "rule_shares": rule,
                   "shared_ms": t["shared"], "unshared_ms": t["unshared"], "speedup": t["unshared"] / t["shared"]}
            out["grid"].append(row)
            print(json.dumps(row), flush=True)
    with tempfile.TemporaryDirectory(prefix="dohnuts-sharing-") as tmp:
        for path in ("workloads/gpu/image-cache-warm-2b.yaml", "workloads/gpu/shared-prefix-2b.yaml"):
            reqs = workload_requests(path, Path(tmp), session.tokenizer, session.cfg)
            splits = {}
            for grid in (64, 8):
                with _planner(PREFIX_ALIGN=grid)():
                    splits[grid] = session.prepare(reqs[0]).plan.prefix_len
            t = _ab(session, reqs, {"grid 64": _planner(PREFIX_ALIGN=64), "grid 8": _planner(PREFIX_ALIGN=8)}, a.calls)
            row = {"workload": path, "split_64": splits[64], "split_8": splits[8], "ms_64": t["grid 64"],
                   "ms_8": t["grid 8"], "cost_of_64": t["grid 64"] / t["grid 8"] - 1}
            out["alignment"].append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
