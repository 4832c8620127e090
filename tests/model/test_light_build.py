"""`dohnuts.load("tiny")` loads no more than it runs, and building on the meta device changes no value.

The README's first Python example answers in a second or two on a CPU because building the model
imports nothing heavy: no torch._dynamo or Triton (torch's meta kernels of `normal_` and `log`
import them: blocks.Embedding and GatedDeltaNet skip those on meta tensors; attention imports
`causal_lower_right` on its GPU path only), no sympy (checkpoint.allocate instead of to_empty),
and none of the optional libraries. The checks are on which modules a fresh interpreter holds —
correctness, not timing — and on the weights the lighter path gives against torch's own path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from dohnuts.config import preset
from dohnuts.model.blocks import Embedding
from dohnuts.model.checkpoint import allocate, init_weights
from dohnuts.model.deltanet import GatedDeltaNet
from dohnuts.model.text import TextBackbone
from dohnuts.model.vision import VisionTower

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "triton", "transformers", "fla", "matplotlib", "scipy", "peft")

README_EXAMPLE = """
import json, sys
import dohnuts
from dohnuts.runtime.requests import Request, Question
model = dohnuts.load("tiny")
[result] = model.predict([Request(id="r1", prefix="colours",
                                  questions=(Question("q1", "Which is red?", ("red", "green")),))])
q = result.questions[0]
print(json.dumps({"probabilities": q.probabilities, "choice": q.choice,
                  "heavy": [m for m in sys.argv[1:] if m in sys.modules]}))
"""


def test_load_and_predict_import_nothing_heavy():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", README_EXAMPLE, *HEAVY], env=env, capture_output=True, text=True,
                          timeout=600)  # a hang guard only
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [], f"dohnuts.load('tiny') + predict imported {out['heavy']}"
    # the README's numbers: [0.54..., 0.45...] 0 — the lighter build gives the same weights
    assert out["choice"] == 0 and math.isclose(out["probabilities"][0], 0.5408, abs_tol=5e-4), out


def test_allocate_is_to_empty():
    """The same parameters and buffers (names, shapes, dtypes, devices, requires_grad) either way."""
    cfg = preset("tiny")
    for build in (lambda: TextBackbone(cfg.text), lambda: VisionTower(cfg.vision)):
        with torch.device("meta"):
            ours, theirs = build().to(torch.bfloat16), build().to(torch.bfloat16)
        allocate(ours, "cpu")
        theirs.to_empty(device="cpu")
        describe = lambda m: [(n, t.shape, t.dtype, t.device, t.requires_grad)  # noqa: E731
                              for n, t in (*m.named_parameters(), *m.named_buffers())]
        assert describe(ours) == describe(theirs)
        assert all(isinstance(p, nn.Parameter) for p in ours.parameters())


def test_seeded_weights_do_not_depend_on_the_allocation():
    cfg = preset("tiny").text
    with torch.device("meta"):
        a, b = TextBackbone(cfg), TextBackbone(cfg)
    allocate(a, "cpu")
    b.to_empty(device="cpu")
    init_weights(a, seed=3)
    init_weights(b, seed=3)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_modules_built_off_the_meta_device_are_initialised_as_before():
    """Embedding and GatedDeltaNet skip only the meta device: on the CPU the embedding draws as
    torch's nn.Embedding does, from the same generator state, and A_log is log U(1, 16)."""
    torch.manual_seed(5)
    ours = Embedding(64, 16)
    torch.manual_seed(5)
    theirs = nn.Embedding(64, 16)
    assert torch.equal(ours.weight, theirs.weight) and ours.weight.std() > 0.5
    a_log = GatedDeltaNet(preset("tiny").text).A_log
    assert a_log.requires_grad and a_log.unique().numel() == a_log.numel()
    assert bool(((a_log >= 0) & (a_log <= math.log(16))).all())  # U(1, 16) itself would exceed log 16
    assert a_log.max() > 1.0  # ... and its log is not skipped to a constant or zeros
    with torch.device("meta"):
        assert GatedDeltaNet(preset("tiny").text).A_log.is_meta
        assert Embedding(64, 16).weight.is_meta
