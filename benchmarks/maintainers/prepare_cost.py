"""Host time of `Session.prepare` for one request of a workload (tokens, plan, batch tensors),
median of N calls after warm-up — the CPU work a single prediction call pays before the device —
and of `Predictor.serialize` + `to_json()`, what it pays after the device.

    python benchmarks/maintainers/prepare_cost.py --workload workloads/gpu/shared-prefix-2b.yaml --calls 20
    python benchmarks/maintainers/prepare_cost.py --workload workloads/gpu/image-cache-warm-2b.yaml --profile 25

The workload's GPU sizes (`on_gpu`) are used; the model is the tiny preset (preparation does not
depend on the model's size with the byte tokenizer of the presets), on the default device (on a
GPU machine the batch is pinned, as in prediction). A warm image-cache workload scores its
request's image once first (the vision tower only), so that its features are cached, as in the
benchmark; a cold one forgets every image before each call (a new image, as in the benchmark).
The sharing decision for the request's shape is taken as measured calls see it
(decided: one plan collated, not both). `--profile N` prints the N functions with the most own
time over the measured calls (cProfile), and the callees of `Session.prepare`.

The serialize line scores the request once (`Predictor.compute`, on the session's device) and
times serializing those host results into the result and its JSON line, as `Predictor.call` does
in its `serialize` stage (the same two medians).

Two medians: back to back (hot caches: the floor), and after a `--gap-ms` busy wait (default 20)
before each call — what a single call pays, whose host waited on the device since its last
prepare. On the CPU machine the second is 2–3× the first (M18: `--workload
workloads/image-cache-warm.yaml` 0.145 → 0.457 ms, `workloads/gpu/image-cache-warm-2b.yaml` 0.15 →
0.33–0.51 ms over three runs; the standard suite's image-cache-warm calls in `dohnuts-bench run`
prepare in 0.44 ms). The wait is busy, so the clock stays up: the factor is the caches the code
finds cold.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="workloads/gpu/shared-prefix-2b.yaml")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default=None, help="the session's device (default: a GPU when there is one)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions by own time")
    p.add_argument("--gap-ms", type=float, default=20.0,
                   help="busy wait before each call of the second median (a single call's cold caches)")
    a = p.parse_args(argv)

    import dohnuts
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = dataclasses.replace(load_workload(a.workload, kinds, targets, gpu=True), model="tiny")
    cfg, ckpt = resolve_source("tiny")
    with tempfile.TemporaryDirectory(prefix="dohnuts-prepare-") as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
        return _measure(dohnuts.load("tiny", device=a.device), calls[0].request, spec, a)


def _measure(session, req, spec, a) -> int:
    if req.image is not None:  # a steady state: image files older than the digest memo's racy window
        from dohnuts.runtime.images import ImageKeyMemo

        time.sleep(ImageKeyMemo.RACY_S)
    if getattr(spec.shape, "cache", None) == "warm":  # its image's features enter the cache (the vision tower only)
        session.image_features([(session.prepare(req), None)])
    cold = getattr(spec.shape, "cache", None) == "cold"

    def prepare():  # a cold workload's call meets a new image, as in the benchmark (the forgetting: µs)
        if cold:
            session.forget_images()
        return session.prepare(req)

    times, gapped = _medians(prepare, a)
    print(f"{a.workload}: prepare {times:.3f} ms back to back, {gapped:.3f} ms after {a.gap_ms:g} ms away "
          f"(medians of {a.calls}, {session.device})")
    if a.profile:  # a second pass under the profiler (its overhead stays out of the median)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            prepare()
        prof.disable()
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(a.profile)
        st.sort_stats("cumulative").print_callees(r"session.py.*\(prepare\)")
    times, gapped = _serialize_medians(session, req, a)
    print(f"{a.workload}: serialize + to_json {times:.3f} ms back to back, {gapped:.3f} ms after {a.gap_ms:g} ms "
          f"away (medians of {a.calls})")
    return 0


def _serialize_medians(session, req, a) -> tuple[float, float]:
    """`_medians` of serializing one scored call's host results (scored once, here)."""
    from dohnuts.runtime.predict import Predictor

    pred = Predictor(session)
    try:
        hb = pred.prepare(req)
        dev, ready = pred.pipeline.transfer(hb)
        host, done, _ = pred.compute(hb, dev, ready)
        if done is not None:
            done.synchronize()
        return _medians(lambda: pred.serialize(hb, host, None).to_json(), a)
    finally:
        pred.close()


def _medians(fn, a) -> tuple[float, float]:
    """Median ms of `fn()` over `a.calls` calls after 3 warm-up calls: back to back, and each after a
    busy wait of `a.gap_ms`."""
    for _ in range(3):
        fn()
    times, gapped = [], []
    for _ in range(a.calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    for _ in range(a.calls):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < a.gap_ms * 1e-3:  # busy: the clock stays up, as in a device wait
            pass
        t0 = time.perf_counter()
        fn()
        gapped.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), statistics.median(gapped)


if __name__ == "__main__":
    raise SystemExit(main())
