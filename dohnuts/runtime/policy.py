"""The execution policy: one for training and serving, fixed. Users do not configure it.

    kernels        the device decides (dohnuts.ops): fused kernels on CUDA tensors, the plain-torch
                   reference paths elsewhere
    sharing        a request's questions share a causal prefix when the planner's rule says so
                   (dohnuts.runtime.plan.shared_prefix_split: split on a multiple of 64 tokens,
                   every scored position in the suffix, enough dense work saved); the same request
                   takes the same path in every process
    passes         chosen in one place (dohnuts.model.scorer.choose_pass): a planned shared prefix
                   runs the shared pass, anything else one batched pass — in prediction, in graph
                   capture and in training alike
    CUDA graphs    every inference pass and every training microbatch replays a captured graph on
                   a GPU (dohnuts.runtime.graphs, dohnuts.train.graphs)
    recompute      training recomputes each layer of the whole request — a shared prefix, its fork
                   and the suffixes — in the backward pass (activation checkpointing, fresh state)
    image cache    128 MiB of frozen image features per loaded model (dohnuts.runtime.image_cache)
    transfers      pinned batches, one copy stream, serialization overlapped (dohnuts.runtime)

Measurement needs a few comparison variants: the same model without sharing (`UNSHARED`), with
eager launches instead of graphs (`EAGER`), or both. They exist for the benchmark's targets and
for tests only — reached through the private `_policy` argument of `dohnuts.api.load` and
`Session` — and every record and report of the benchmark labels them measurement-only. The plain
reference ops (`dohnuts.ops._dispatch.reference()`, private) are the third such variant: parity tests only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecutionPolicy:
    """What the runtime does; `PRODUCT` is the only policy a user ever runs."""

    share_prefix: bool = True  # compute a shared prefix once when the planner's rule says so
    cuda_graphs: bool = True  # replay captured passes on a GPU

    @property
    def variant(self) -> str | None:
        """None for the product; otherwise the measurement-only variant's name."""
        parts = [name for name, off in (("unshared", not self.share_prefix), ("eager", not self.cuda_graphs)) if off]
        return "+".join(parts) or None


PRODUCT = ExecutionPolicy()
# Measurement-only variants (benchmark targets and tests; never a user setting).
UNSHARED = ExecutionPolicy(share_prefix=False)
EAGER = ExecutionPolicy(cuda_graphs=False)
