"""dohnuts' differentiable kernels — the forward kernels that serve prediction, each the forward of
a torch.autograd.Function with a backward — against torch.autograd through the plain-torch
references, on the CPU in Triton's interpreter (tests/ops/interpreted_autograd.py, in a fresh
process: the interpreter must be chosen before any kernel is made). The conv and delta-rule checks
run a covering subset of their cases in the test command, every case in the `full` lane. fla's backward kernels run
there too, with two interpreter patches that match compiled Triton (documented in that module)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _interpret(check: str, timeout: int, full: bool = True) -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"from tests.ops.interpreted_autograd import main; main({check!r}, full={full!r})"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("full", [pytest.param(False, id="covering"), pytest.param(True, id="every-case",
                                                                                   marks=pytest.mark.full)])
def test_conv_kernel_gradients_in_the_interpreter(full):
    """The conv + SiLU (+ L2 norm of q and k) Function: dx (x a strided column slice), dweight and
    the initial state's gradient — a state per row, a forked (stride-0) view of a state in the
    graph, one (1, C, W) state for every row — with and without the final state's gradient, at
    partial blocks and fewer tokens than the conv width; the forward under autograd is bitwise
    the forward without it; `causal_conv1d_parts`' fused path runs the same Function."""
    _interpret("conv", 600, full)


@pytest.mark.slow
def test_gdn_gates_kernel_gradients_in_the_interpreter():
    """The gates Function: gradients of a and b (column slices of a packed projection), A_log and
    dt_bias, from g, β or both; a partial chunk, a head count that is not a power of two, a logit
    past the softplus threshold; bitwise the same forward without autograd."""
    _interpret("gates", 300)


@pytest.mark.slow(seconds=35)
@pytest.mark.parametrize("full", [pytest.param(False, id="covering"), pytest.param(True, id="every-case",
                                                                                   marks=pytest.mark.full)])
def test_delta_rule_gradients_in_the_interpreter(full):
    """The chunked delta rule Function (dohnuts' forward kernels, fla's backward) from the gate
    logits: every gradient (q, k, v, a, b, A_log, dt_bias, the initial state) against FP64
    autograd through the torch gates and chunked reference — the fused output kernel and the
    split one, no state, a state per row and a forked (stride-0) one in the graph, q and k
    normalised inside or already by the conv; bitwise the same forward without autograd; and
    `gated_delta_rule`'s fused path on explicit gates."""
    _interpret("delta_rule", 900, full)


@pytest.mark.slow
def test_shared_pass_mixer_gradients_in_the_interpreter():
    """Gated DeltaNet's shared pass (a prefix, its conv and recurrent states forked as expanded
    views into the suffixes) on the fused conv and delta rule equals the reference ops: output,
    the input's and every parameter's gradient — the branches' gradients reach the prefix."""
    _interpret("shared_mixer", 600)
