"""Scratch (session 39): a single call's host work before the pass (`Session.prepare`) on the CPU,
at the GPU workloads' request shapes, with the 2b preset's configuration (its weights are never
run). Usage: python prepare_prof.py WORKLOAD [N] — shared-prefix, text, image, image-cache-warm."""
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import dohnuts
from dohnuts_bench_plugins.workloads import ImageShape, SharedPrefixShape, TextShape, _write_image, text_request

which = sys.argv[1] if len(sys.argv) > 1 else "shared-prefix"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
s = dohnuts.load("qwen3.5-2b", device="cpu", dtype=torch.bfloat16)
image = None
if which == "shared-prefix":
    shape = SharedPrefixShape(requests=1, questions=32, seq_tokens=512, prefix_tokens=437, candidate_tokens=2)
elif which == "text":
    shape = TextShape(requests=1, questions=32, seq_tokens=512, candidate_tokens=2)
else:
    shape = ImageShape(requests=1, questions=8, seq_tokens=256, candidates=4, candidate_tokens=4,
                       resolution=[448, 448])
    image = _write_image(Path(tempfile.mkdtemp()) / "image0.png", (448, 448), np.random.default_rng(0))
ctx = SimpleNamespace(rng=random.Random(0), tokenizer=s.tokenizer)
req = text_request(ctx, shape, "r0", image=image)
if image is not None:  # the features cached, as a warm call finds them
    from dohnuts.runtime.predict import Predictor
    Predictor(s).call(req)
time.sleep(1.2)  # past the file memo's racy window
for _ in range(20):
    s.prepare(req)
t = time.perf_counter()
for _ in range(n):
    hb = s.prepare(req)
print(f"{which}: prepare {(time.perf_counter() - t) / n * 1e3:.3f} ms")
pr = cProfile.Profile()
pr.enable()
for _ in range(n):
    s.prepare(req)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
