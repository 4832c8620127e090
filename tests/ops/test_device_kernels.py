"""A GPU without working fused kernels runs every op on its reference path: correct results, one
line on stderr, never a crash. On the CPU: the real probe against a GPU this machine does not
have, and ops on tensors that say they are on a GPU (`PretendGpu`) whose probe fails."""

from __future__ import annotations

import threading

import pytest
import torch

import dohnuts.ops as ops
import dohnuts.ops._dispatch as dispatch
from dohnuts.config import preset
from dohnuts.model.build import build_text_backbone
from dohnuts.ops._dispatch import DeviceKernels, kernel_status, probe_fused_kernels, use_fused
from dohnuts.ops._dispatch import reference as reference_ops


class PretendGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU: the ops' device decision sees a GPU, the arithmetic
    stays on the CPU (torch keeps the subclass through every op)."""

    @property
    def is_cuda(self):
        return True


def _failing(device):
    raise RuntimeError("triton: no backend for gfx1036\nsecond line")


def test_the_real_probe_on_a_machine_without_that_gpu(capsys):
    """The probe that runs at the first fused call fails here (no GPU, fla hidden by conftest):
    the device is reference-only, said in one line, once."""
    kernels = DeviceKernels(probe_fused_kernels)
    cuda0 = torch.device("cuda", 0)
    assert kernels.fused(cuda0) is False and kernels.fused(cuda0) is False
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dohnuts: cuda:0")
    assert "no working fused kernels" in lines[0] and lines[0].endswith("plain-torch reference path there")
    assert kernels.status(cuda0).startswith("reference (")


def test_one_line_per_device_and_the_verdict_is_kept(capsys):
    calls = []

    def probe(device):
        calls.append(device)
        if device.index == 1:
            _failing(device)

    kernels = DeviceKernels(probe)
    threads = [threading.Thread(target=kernels.fused, args=(torch.device("cuda", i % 2),)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(d.index for d in calls) == [0, 1]  # probed once per device, whatever the threads
    assert kernels.fused(torch.device("cuda", 0)) is True and kernels.fused(torch.device("cuda", 1)) is False
    err = capsys.readouterr().err.splitlines()
    assert err == [f"dohnuts: cuda:1 has no working fused kernels (RuntimeError: triton: no backend for gfx1036 "
                   "second line); every op runs its plain-torch reference path there"]
    assert kernels.status(torch.device("cuda", 0)) == "fused"
    assert kernels.status(torch.device("cuda", 1)) == "reference (RuntimeError: triton: no backend for gfx1036 second line)"
    assert kernel_status(torch.device("cpu")) == "reference"


@pytest.fixture
def no_kernels(monkeypatch):
    """This process's GPUs (here: the pretend one) have no working fused kernels."""
    monkeypatch.setattr(dispatch, "_KERNELS", DeviceKernels(_failing))


def _gpu(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(PretendGpu)


@torch.no_grad()
def test_every_op_takes_its_reference_path_there(no_kernels, capsys):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x, res, w, gate = r(2, 5, 64), r(2, 5, 64), r(64), r(2, 5, 64)
    assert use_fused(_gpu(x)) is False
    B, T, H, D = 2, 40, 2, 16
    q, k, v = r(B, T, H, D), r(B, T, H, D), r(B, T, 2 * H, D)
    a, b = r(B, T, 2 * H), r(B, T, 2 * H)
    A_log, dt_bias = r(2 * H), r(2 * H)
    cases = {
        "rms_norm": (ops.rms_norm, (x, w, 1e-6, 1.0)),
        "add_rms_norm": (ops.add_rms_norm, (x, res, w, 1e-6, 1.0)),
        "gated_rms_norm": (ops.gated_rms_norm, (x, gate, w, 1e-6)),
        "swiglu_packed": (ops.swiglu_packed, (r(2, 5, 128),)),
        "causal_conv1d_qkv": (ops.causal_conv1d_qkv, (r(B, T, 96), r(96, 4), [32, 32, 32], 16, r(B, 96, 4), True)),
        "gated_delta_rule_from_logits": (ops.gated_delta_rule_from_logits,
                                         (q, k, v, a, b, A_log, dt_bias, r(B, 2 * H, D, D), True)),
        # a shared pass's rows: a prefix of 20, then 3 suffixes of 7
        "causal_conv1d_qkv_shared": (ops.causal_conv1d_qkv_shared, (r(41, 96), r(96, 4), [32, 32, 32], 16, 20, 7)),
        "gated_delta_rule_shared": (ops.gated_delta_rule_shared,
                                    (r(41, H, D), r(41, H, D), r(41, 2 * H, D), r(41, 2 * H), r(41, 2 * H), A_log,
                                     dt_bias, 20, 7, ops.shared_chunk_index(20, 3, 7, "cpu"), False)),
        "causal_attention": (ops.causal_attention, (r(B, 4, T, D), r(B, 2, T, D), r(B, 2, T, D), D ** -0.5)),
        "gated_output": (ops.gated_output, (r(B, H, T, D), r(B, T, H, D))),
        "norm_rope": (ops.norm_rope, (r(B, T, H, D), r(D), 1e-6, 1.0, r(B, T, 8), r(B, T, 8))),
        "rotary_qk": (ops.rotary_qk, (r(T, 3, H, D), r(T, 1, D), r(T, 1, D))),
        "layer_norm": (ops.layer_norm, (x, w, r(64), 1e-6)),
        "add_layer_norm": (ops.add_layer_norm, (x, res, w, r(64), 1e-6)),
        "linear_gelu_tanh": (ops.linear_gelu_tanh, (r(7, 64), r(32, 64), r(32))),
        "block_diagonal_attention": (ops.block_diagonal_attention, (r(3 * T, H, D), r(3 * T, H, D), r(3 * T, H, D),
                                                                     [T, T, T])),
    }
    for name, (fn, args) in cases.items():
        got = fn(*[_gpu(t) if isinstance(t, torch.Tensor) else t for t in args])
        with reference_ops():
            want = fn(*args)
        flat_got = [t for t in _flatten(got)]
        flat_want = [t for t in _flatten(want)]
        assert len(flat_got) == len(flat_want), name
        for u, v_ in zip(flat_got, flat_want):
            assert isinstance(u, PretendGpu), name  # it ran on the "GPU" tensors
            assert torch.equal(u.as_subclass(torch.Tensor), v_), name
    dst = _gpu(torch.zeros(2, 2, 3, 16))
    ops.copy4d(dst, _gpu(r(1, 2, 3, 16)))
    assert capsys.readouterr().err.count("no working fused kernels") == 1  # one line for the device


def _flatten(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _flatten(y)


@torch.no_grad()
def test_a_whole_pass_on_that_gpu_equals_the_reference(no_kernels, capsys):
    model, _ = build_text_backbone(preset("tiny"), device="cpu", seed=3)
    model = model.eval()
    ids = torch.randint(0, 256, (3, 70), generator=torch.Generator().manual_seed(0))
    with reference_ops():
        want = model(ids)
    got = model(_gpu(ids))
    flat_got, flat_want = list(_flatten(got)), list(_flatten(want))
    assert flat_got and len(flat_got) == len(flat_want)
    for u, v in zip(flat_got, flat_want):
        assert isinstance(u, PretendGpu) and torch.equal(u.as_subclass(torch.Tensor), v)
    assert capsys.readouterr().err.count("\n") == 1


_WITHOUT_TRITON = """
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTriton())
import fla  # fla-core imports without Triton (its kernels would need it)
import dohnuts
from dohnuts.bench.cli import main
from dohnuts.runtime.requests import Question, Request

model = dohnuts.load("tiny")
[r] = model.predict([Request(id="r", prefix="colours", questions=(Question("q", "Which is red?", ("red", "green")),))])
assert len(r.questions[0].probabilities) == 2
assert main(["list"]) == 0
assert "triton" not in sys.modules
print("ok")
"""


def test_the_runtime_needs_no_triton_on_a_cpu():
    """pyproject.toml lists no `triton` (the ROCm wheel of torch brings its own): on a CPU machine
    without one, the runtime predicts and dohnuts-bench starts, and nothing imports Triton."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
