"""Built-in targets: `dohnuts` (the product), and its peers at their best on the same weights,
measured on the same calls in the same run: `transformers` (transformers' own Qwen3.5
implementation, for prediction) and `transformers+peft` (that model trained with PEFT LoRA)."""

from __future__ import annotations

from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget
from dohnuts_bench_plugins.targets.peft_target import TransformersPeftTarget
from dohnuts_bench_plugins.targets.transformers_target import TransformersTarget
from dohnuts.bench.hookspecs import hookimpl


@hookimpl
def dohnuts_bench_register_targets():
    return {"dohnuts": DohnutsTarget, "transformers": TransformersTarget, "transformers+peft": TransformersPeftTarget}
