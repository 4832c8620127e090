"""`dohnuts-bench` with every target's calls made slower by a factor, on purpose: how the gate's
tests (tests/bench/test_regression_gate.py) and its demonstration inject a regression.

    python -m tests.bench.slowdown 2 run workloads/text.yaml --out /tmp/slowed    # 2× slower calls

Each built-in target's `run_call` keeps its core busy for (factor − 1) × its own duration after it
returns: inside the measured wall time, so a measured call takes `factor` times as long. Busy, not
asleep: a regression in code does more work, and a sleeping process would read in its `load`
telemetry as one that got less of a core — what the load rule (dohnuts.bench.analysis.load_verdict)
takes for a busy machine."""

from __future__ import annotations

import contextlib
import sys
import time


@contextlib.contextmanager
def slowed_targets(factor: float):
    """Every built-in target's calls `factor` times as long while the context is open."""
    from dohnuts.bench.plugins import plugin_manager

    targets = plugin_manager().get_plugin("targets")  # the built-in targets, found as the CLI finds them
    originals = {cls: cls.run_call for cls in (targets.DohnutsTarget, targets.TransformersTarget)}

    def slowed(run_call):
        def run_call_slowly(self, call, timer):
            t0 = time.perf_counter()
            result = run_call(self, call, timer)
            end = time.perf_counter() + (time.perf_counter() - t0) * (factor - 1.0)
            while time.perf_counter() < end:  # busy (module docstring)
                pass
            return result
        return run_call_slowly

    try:
        for cls, run_call in originals.items():
            cls.run_call = slowed(run_call)
        yield
    finally:
        for cls, run_call in originals.items():
            cls.run_call = run_call


def main(argv: list[str]) -> int:
    from dohnuts.bench.cli import main as bench

    factor = float(argv[0])
    with slowed_targets(factor):
        return bench(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
