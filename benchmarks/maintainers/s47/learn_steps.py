"""Scratch (session 47): tests/train/test_learning.py's run with the held-out accuracy after 20, 25,
30, 35, 40 and 50 updates, and the CPU time to each.

    .venv/bin/python benchmarks/maintainers/s47/learn_steps.py
"""
import sys, time, torch
sys.path.insert(0, '.')
from tests.train.test_learning import _accuracy
from dohnuts import api
from dohnuts.model.lora import LoRAConfig
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer
from dohnuts.train.task import synthetic_requests
torch.manual_seed(0)
model = api.load("tiny", lora=LoRAConfig(rank=8))
train = synthetic_requests(200, seed=1)
held_out = synthetic_requests(30, seed=2, id_prefix="held")
print("before", _accuracy(model, held_out))
cfg = OptimConfig(lr=3e-3)
updater = Updater(model, make_optimizer(model, cfg), RLCDConfig(), cfg)
t = time.process_time()
for n, _ in enumerate(updater.run([train[(4 * step + j) % len(train)] for j in range(4)] for step in range(50)), 1):
    if n in (20, 25, 30, 35, 40, 50):
        print(n, round(time.process_time() - t, 1), _accuracy(model, held_out), flush=True)
updater.close()
