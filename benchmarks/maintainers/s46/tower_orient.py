"""Scratch (session 46): the 2b tower as landed against the same tower whose MLPs run fc1 transposed
(hᵀ = gelu([W₁ | b₁ | 0] · [x | 1 | 0]ᵀ), the bias folded into the inner dimension, the input
copied into a widened buffer inside the graph — a product version would have the LayerNorm write
it) and fc2 reading hᵀ as a transposed operand; each its own 2b session's `graphs.encode` (as a
cold call runs it), taking turns by rounds; outputs against the FP32 tower.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s46/tower_orient.py OUT.json
"""
import copy
import json
import statistics
import sys
import types

import numpy as np
import torch

import dohnuts
from dohnuts.model import vision as V
from dohnuts.runtime.images import pixel_values
from dohnuts.runtime.timing import StageTimer

PAD = 8


def transposed_forward(self, x):
    fc1, fc2 = self.linear_fc1, self.linear_fc2
    N, H = x.shape
    xa = torch.empty(N, H + PAD, device=x.device, dtype=x.dtype)
    xa[:, :H].copy_(x)
    xa[:, H:].copy_(self._tail.expand(N, -1))
    ht = torch._addmm_activation(self._zero[:N], self._w1a, xa.t(), use_gelu=True)  # (I, N)
    return torch.addmm(fc2.bias, ht.t(), fc2.weight.t())


def transpose_mlps(tower, max_rows=4096):
    for m in tower.modules():
        if isinstance(m, V.VisionMLP):
            w, b = m.linear_fc1.weight, m.linear_fc1.bias
            w1a = torch.zeros(w.shape[0], w.shape[1] + PAD, device=w.device, dtype=w.dtype)
            w1a[:, :w.shape[1]] = w
            w1a[:, w.shape[1]] = b
            m._w1a = w1a
            m._tail = torch.zeros(1, PAD, device=w.device, dtype=w.dtype)
            m._tail[0, 0] = 1
            m._zero = torch.zeros(max_rows, device=w.device, dtype=w.dtype)
            m.forward = types.MethodType(transposed_forward, m)


def main(path=None, device="cuda", preset="qwen3.5-2b", rounds=8, calls=25):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    sessions = {name: dohnuts.load(preset, device=device) for name in ("landed", "fc1 transposed")}
    transpose_mlps(sessions["fc1 transposed"].model.visual)
    out = {}
    for label, grid, n_img in (("448x448", [1, 28, 28], 1), ("512x512", [1, 32, 32], 1)):
        grids = torch.tensor([grid] * n_img)
        n = grid[1] * grid[2] * n_img
        imgs = [torch.randint(0, 256, (n, 768), dtype=torch.uint8, generator=g).to(device) for _ in range(4)]
        tower32 = copy.deepcopy(sessions["landed"].model.visual).float()
        with torch.no_grad():
            ref32 = tower32(pixel_values(imgs[0], 2).float(), grids).float()
        del tower32
        rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
        res = {"rel_err_fp32": {}, "ms": {}}
        with torch.no_grad():
            if device == "cuda":
                feats = {name: s.graphs.encode(imgs[0], grids).float() for name, s in sessions.items()}
            else:  # a CPU check of the arithmetic (no graphs there)
                feats = {name: s.model.visual(pixel_values(imgs[0], 2).to(torch.bfloat16), grids).float()
                         for name, s in sessions.items()}
            for name, f in feats.items():
                res["rel_err_fp32"][name] = rel(f, ref32)
            if device != "cuda":
                out[label] = res
                print(label, res, flush=True)
                continue
            times = {nm: [] for nm in sessions}
            for rnd in range(rounds):
                order = list(sessions) if rnd % 2 == 0 else list(reversed(list(sessions)))
                for name in order:
                    for i in range(calls):
                        timer = StageTimer(torch.device("cuda", 0))
                        with timer.stage("tower"):
                            sessions[name].graphs.encode(imgs[i % 4], grids)
                        times[name].append(timer.result()["tower"].device_ms)
        res["ms"] = {nm: {"median": round(statistics.median(v), 4), "p10": round(float(np.percentile(v, 10)), 4),
                          "p90": round(float(np.percentile(v, 90)), 4),
                          "round_medians": [round(statistics.median(v[i:i + calls]), 4) for i in range(0, len(v), calls)]}
                     for nm, v in times.items()}
        out[label] = res
        print(label, {nm: (res["ms"][nm]["median"], round(res["rel_err_fp32"][nm], 5)) for nm in res["ms"]}, flush=True)
    if path:
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
