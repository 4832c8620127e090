"""Shared helpers of the GPU tests (tests/gpu): inputs at Qwen3.5's sizes and FP32 references."""

from __future__ import annotations

import contextlib
import threading

import torch

from tests.reference import relative_error

DEV = "cuda"
BF16_TOL = 2e-2

def _pair(*shape, scale=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(*shape, device=DEV, generator=g) * scale
    return x.bfloat16().requires_grad_(), x.clone().requires_grad_()

def _grads(*xs):
    return [x.grad for x in xs]

@contextlib.contextmanager
def busy_preparing_thread(session, folder):
    """A worker thread that prepares a new image's request on `session` in a loop, as a preparing
    thread does beside a call's passes (its image forgotten each time: the PNG inflated into
    page-locked memory, unfiltered and cut into patches on the thread's own stream, the pixels
    back for the key). One preparation is done before the block starts and one is finished after
    it ends (the waits are hang guards only), so the loop spans the whole block however busy the
    machine; a preparation that raised fails the block."""
    import numpy as np
    from PIL import Image

    from dohnuts.runtime.requests import Question, Request

    path = folder / "busy.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    req = Request(id="busy", questions=(Question("a", "what?", ("red", "green")),), prefix="a photo", image=str(path))
    stop, failed = threading.Event(), []
    rounds = threading.Condition()
    done = [0]

    def work():
        try:
            while not stop.is_set():
                session.forget_images()
                session.prepare(req)
                with rounds:
                    done[0] += 1
                    rounds.notify_all()
        except BaseException as exc:  # said by the block's end, not lost in the thread
            failed.append(exc)
            with rounds:
                rounds.notify_all()

    def one_more(after: int) -> None:
        with rounds:
            assert rounds.wait_for(lambda: done[0] > after or failed, timeout=300), "the worker hung"
        assert not failed, failed

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        one_more(0)
        yield
        one_more(done[0])
    finally:
        stop.set()
        worker.join(timeout=300)
    assert not failed, failed

def _wide_tiny(monkeypatch):
    """The tiny preset with Qwen3.5's linear-attention head dims (128), which fla's kernels need
    on Hopper (KI-1)."""
    from msgspec.structs import replace  # configs are msgspec Structs

    import dohnuts.config as config

    tiny = config.preset("tiny")
    wide = replace(tiny, text=replace(tiny.text, linear_key_head_dim=128, linear_value_head_dim=128))
    monkeypatch.setitem(config.PRESETS, "tiny", lambda: wide)

def _gdn_logit_inputs(B: int, T: int, seed: int):
    """A generator and the raw inputs of the delta rule at Qwen3.5-2b head sizes (H = HV = 16,
    K = V = 128), BF16: q, k, v, the gate logits a and b, A_log and dt_bias."""
    H = HV = 16
    K = V = 128
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=DEV, generator=g).bfloat16()
    k = torch.randn(B, T, H, K, device=DEV, generator=g).bfloat16()
    v = torch.randn(B, T, HV, V, device=DEV, generator=g).bfloat16()
    a = torch.randn(B, T, HV, device=DEV, generator=g).bfloat16()
    b = torch.randn(B, T, HV, device=DEV, generator=g).bfloat16()
    A_log = torch.empty(HV, device=DEV).uniform_(1, 16, generator=g).log().bfloat16()
    dt_bias = torch.randn(HV, device=DEV, generator=g).bfloat16()
    return g, (q, k, v, a, b, A_log, dt_bias)

def _assert_matches_fp32_reference(o, s, inputs, initial_state):
    """o and the final state s of the delta rule on `inputs` (q, k, v, a, b, A_log, dt_bias) equal
    the FP32 chunked reference with the torch gates, within the BF16 gate."""
    from dohnuts.ops.delta_rule import gated_delta_rule_reference, gdn_gates_reference

    q, k, v, a, b, A_log, dt_bias = inputs
    gf, bf = gdn_gates_reference(a.float(), b.float(), A_log, dt_bias)
    o_ref, s_ref = gated_delta_rule_reference(q.float(), k.float(), v.float(), gf, bf, initial_state=initial_state,
                                              output_final_state=True)
    assert relative_error(o.float(), o_ref) < BF16_TOL and relative_error(s, s_ref) < BF16_TOL

WU_TOL = 3e-3

def _assert_no_less_accurate(ours, theirs, ref, what, slack=1.25):
    """`ours` is at least about as close to the FP32 reference `ref` as fla's `theirs`: a wrong
    v_new (a missing β, a stale A) moves ours by far more than the slack."""
    e_ours, e_fla = relative_error(ours.float(), ref), relative_error(theirs.float(), ref)
    assert e_ours <= slack * e_fla + 1e-5, f"{what}: {e_ours:.2e} from the FP32 reference, fla {e_fla:.2e}"

def _fp32_reference(inputs, initial_state):
    from dohnuts.ops.delta_rule import gated_delta_rule_reference, gdn_gates_reference

    q, k, v, a, b, A_log, dt_bias = inputs
    gf, bf = gdn_gates_reference(a.float(), b.float(), A_log, dt_bias)
    return gated_delta_rule_reference(q.float(), k.float(), v.float(), gf, bf, initial_state=initial_state,
                                      output_final_state=True)
