"""Session 56 (scratch): `dohnuts train`'s lifecycle on image requests (train, resume, initialize-from;
tests/train/test_train_images.py's data) with every graph emulated on the CPU, as a GPU session runs
them: the dev evaluation's prediction before the first update, then training's encodes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/maintainers/s56/lifecycle_emulated.py OUT_DIR
"""
import json, sys
from pathlib import Path
import torch
import dohnuts.runtime.session as S
import dohnuts.train.graphs as TG
import dohnuts.train.step as ST
from dohnuts.runtime.graphs import PassGraphs

orig_init = S.Session.__init__
def init(self, *a, **k):
    orig_init(self, *a, **k)
    if self._policy.cuda_graphs:
        self.graphs = PassGraphs(self.model, emulate=True)
S.Session.__init__ = init
orig_mg = TG.MicrobatchGraphs.__init__
def mg(self, *a, **k):
    k["emulate"] = True
    orig_mg(self, *a, **k)
TG.MicrobatchGraphs.__init__ = mg
sys.path.insert(0, ".")
from tests.train.test_train_images import _image_data
from dohnuts.cli import main
root = Path(sys.argv[1])
data = _image_data(root / "data")
run = root / "run"
common = ["train", "--model", "tiny", "--data", str(data), "--eval-every", "1", "--lora-rank", "2", "--device", "cpu"]
print(main([*common, "--out", str(run), "--updates", "2"]))
print(main([*common, "--out", str(run), "--updates", "3", "--resume"]))
print(main([*common, "--out", str(root / "run2"), "--updates", "1", "--initialize-from", str(run / "best.safetensors")]))
print(json.loads((run / "summary.json").read_text()))
