"""Session 56 (scratch): the early tower under prediction's pipeline in emulation (CPU, every graph
emulated): 4 workers, 30 requests (24 new images of two grids, then 6 repeats) against the eager
session, scores compared bit for bit, the cache and graph counts printed. On the patched branch:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/maintainers/s56/stress_emulated.py
"""
import numpy as np, torch
from PIL import Image
import dohnuts.api as api
from dohnuts.runtime.graphs import PassGraphs
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Question, Request
qs = (Question("q1", "what?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")))
reqs = []
for i in range(24):
    p = f"/tmp/st{i}.png"
    size = (448, 448) if i % 3 else (448, 512)
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (*size, 3), dtype=np.uint8)).save(p)
    reqs.append(Request(id=f"r{i}", questions=qs, prefix="a photo", image=p))
reqs += reqs[:6]  # repeats: cache hits and early features for keys already stored
eager = api.load("tiny")
g = api.load("tiny"); g.graphs = PassGraphs(g.model, emulate=True)
pred = Predictor(g, workers=4)
with torch.inference_mode():
    got = list(pred.run(((r.id, r) for r in reqs)))
pred.close()
want = eager.predict(reqs)
worst = 0
for a, b in zip(got, want):
    x = torch.tensor([s for q in a.questions for s in q.scores]); y = torch.tensor([s for q in b.questions for s in q.scores])
    worst = max(worst, float((x - y).abs().max()))
print("worst", worst, g.graphs.stats(), g.image_cache.stats())
