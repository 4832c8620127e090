"""Built-in targets: `dohnuts` (the product) and `transformers` (the same weights run by
transformers' own Qwen3.5 implementation), measured on the same calls in the same run."""

from __future__ import annotations

from dohnuts.bench.builtin.targets.dohnuts_target import DohnutsTarget
from dohnuts.bench.builtin.targets.transformers_target import TransformersTarget
from dohnuts.bench.hookspecs import hookimpl


@hookimpl
def dohnuts_bench_register_targets():
    return {"dohnuts": DohnutsTarget, "transformers": TransformersTarget}
