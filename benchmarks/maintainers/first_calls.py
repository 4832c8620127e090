"""Where a fresh machine's first calls go: one `dohnuts-bench run` in this process, with every Triton
compile, launcher build and autotune logged by thread and time.

    python3 benchmarks/maintainers/first_calls.py $OUT/first_calls.json -- run workloads/image-cache-cold.yaml \\
        workloads/train-step.yaml --out /tmp/runs

Run it as a machine's first process (`gpu_session.sh` with FIRST_CALLS=...), so that nothing is
cached yet. It writes the events and a summary to the JSON file and prints the summary.

- **Compiles.** A preload on a compile-ahead thread (`dohnuts-compile_*`, dohnuts/ops/_precompile.py)
  is expected. A compile at a launch is a kernel the table's `compiled` list missed.
- **Launcher builds.** On Triton 3.6 each argument signature's launcher is a C stub built by `gcc`.
  Builds on the compile threads are expected; builds on the main thread sit in a first call.
- **Autotunes.** An autotune that benchmarks (seconds, not milliseconds) is a key the tuned table
  does not hold, or holds under another source or line (tests/ops/test_tuned.py).

docs/history/evolution.md M44 has the first use: 5.3 s of launcher stubs in a fresh H200's first
call, and a moved `_conv_kernel` that autotuned again.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

SLOW_AUTOTUNE_S = 0.05  # a lookup in the disk cache takes about a millisecond; a benchmark, seconds


def summary(events: list[dict]) -> dict:
    """The events counted: preloads, launch compiles by kernel, launcher builds by thread kind and
    the autotunes that benchmarked (key and seconds)."""
    compiles = [e for e in events if e["what"] == "compile"]
    preloads = [e for e in compiles if e["thread"].startswith("dohnuts-compile")]
    launched = [e for e in compiles if not e["thread"].startswith("dohnuts-compile")]
    builds = [e for e in events if e["what"] == "launcher build"]
    tuned = [e for e in events if e["what"] == "autotune" and e["seconds"] >= SLOW_AUTOTUNE_S]
    return {
        "preloads": len(preloads),
        "launch_compiles": dict(collections.Counter(e["kernel"] for e in launched).most_common()),
        "launcher_builds": {"compile threads": sum(e["thread"].startswith("dohnuts-compile") for e in builds),
                            "other threads": sum(not e["thread"].startswith("dohnuts-compile") for e in builds),
                            "other threads' seconds": round(sum(e["seconds"] for e in builds
                                                                if not e["thread"].startswith("dohnuts-compile")), 3)},
        "autotunes_benchmarked": [{"kernel": e["kernel"], "seconds": e["seconds"], "key": e["key"], "at_s": e["t"]}
                                  for e in tuned],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSON file: events and summary")
    args = parser.parse_args(argv[:split])

    t0 = time.perf_counter()
    events: list[dict] = []

    def event(what: str, kernel: str, seconds: float = 0.0, key: str = "") -> None:
        events.append({"t": round(time.perf_counter() - t0, 3), "thread": threading.current_thread().name,
                       "what": what, "kernel": kernel, "seconds": round(seconds, 3), "key": key})

    # Triton: this script runs on a GPU machine
    import triton.runtime.autotuner as autotuner
    import triton.runtime.build as build
    from triton import knobs

    def compiled(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        jit = fn.jit_function.fn
        event("compile", f"{jit.__module__}.{jit.__name__}")
        return False

    knobs.runtime.jit_post_compile_hook = compiled
    check_disk_cache = autotuner.Autotuner.check_disk_cache

    def timed_check(self, tuning_key, *rest, **kw):
        start = time.perf_counter()
        try:
            return check_disk_cache(self, tuning_key, *rest, **kw)
        finally:
            fn = self.fn
            while hasattr(fn, "fn"):
                fn = fn.fn
            event("autotune", getattr(fn, "__name__", str(fn)), time.perf_counter() - start, str(tuning_key)[:200])

    autotuner.Autotuner.check_disk_cache = timed_check
    gcc = build._build  # compile_module_from_src calls it by its module's name: the wrapper is found

    def timed_build(name, *rest, **kw):
        start = time.perf_counter()
        try:
            return gcc(name, *rest, **kw)
        finally:
            what = "launcher build" if name == "__triton_launcher" else "module build"
            event(what, name, time.perf_counter() - start)

    build._build = timed_build

    from dohnuts.bench.cli import main as bench

    status = bench(argv[split + 1:])
    result = {"summary": summary(events), "events": events}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
