"""Session 56 (scratch): the fix of M69 through `Updater` (CPU, emulated graphs): a session predicts one
448² image (the tower captured in inference mode), then one update of four requests that share one
new image of that grid; its loss against a session that never predicted. On 1fd3065's code it
raised "Inplace update to inference tensor outside InferenceMode"; on f12d622 both losses 0.86176.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/maintainers/s56/updater_after_predict.py
"""
import numpy as np, torch
from PIL import Image
from dohnuts.runtime.graphs import PassGraphs
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import MICROBATCHES, OptimConfig, Updater, make_optimizer
from dohnuts.train.graphs import MicrobatchGraphs
from tests.reference import adapted_tiny
def request(i, image=None):
    image = i if image is None else image
    path = f"/tmp/u{image}.png"
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    qs = (Question("a", "what?", ("red", "green"), (1.0, 0.0)), Question("b", "how many?", ("one", "two"), (0.0, 1.0)))
    return Request(id=f"r{i}", questions=qs, prefix="a photo", image=str(path))
dev, update = [request(0)], [request(i, image=1) for i in range(1, 5)]
losses = []
for predicted in (True, False):
    torch.manual_seed(0)
    s = adapted_tiny(); s.graphs = PassGraphs(s.model, emulate=True)
    if predicted:
        s.predict(dev); print(s.graphs.stats().captures)
    opt = make_optimizer(s, OptimConfig()); params = [p for g in opt.param_groups for p in g['params']]
    u = Updater(s, opt, RLCDConfig(), OptimConfig(), _graphs=MicrobatchGraphs(s.model, RLCDConfig(), params, divisor=MICROBATCHES, emulate=True))
    losses.append(u.update(update).loss); u.close()
print(losses)
