"""Scratch (session 47, from s46): the 2b tower on the branch (fc2 as yᵀ = W₂ · hᵀ, its bias added by the
LayerNorm kernel that reads yᵀ as it lies) against the same tower with its blocks as before (fc2
`F.linear` with its bias epilogue, the rows kernel) — each its own 2b session's `graphs.encode`,
taking turns by rounds; outputs against the FP32 tower. Images of 448², 4 × 448², 512² and 1024².

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s47/tower_fc2_ab.py OUT.json
"""
import copy
import json
import statistics
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

import dohnuts
from dohnuts.model import vision as V
from dohnuts.ops import add_layer_norm, linear_gelu_tanh
from dohnuts.runtime.images import pixel_values
from dohnuts.runtime.timing import StageTimer


def before_forward(self, h, x, rope, seqlens, next_norm):
    h, x = V._add_norm(self.attn(h, rope, seqlens), x, self.norm2)
    fc1, fc2 = self.mlp.linear_fc1, self.mlp.linear_fc2
    y = F.linear(linear_gelu_tanh(h, fc1.weight, fc1.bias), fc2.weight, fc2.bias)
    return add_layer_norm(y, x, next_norm.weight, next_norm.bias, next_norm.eps)


def main(path=None, rounds=6, calls=20):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    sessions = {name: dohnuts.load("qwen3.5-2b", device="cuda") for name in ("before", "fc2 transposed")}
    for m in sessions["before"].model.visual.modules():
        if isinstance(m, V.VisionBlock):
            m.forward = types.MethodType(before_forward, m)
    out = {}
    for label, grid, n_img in (("448x448", [1, 28, 28], 1), ("4 x 448x448", [1, 28, 28], 4),
                               ("512x512", [1, 32, 32], 1), ("1024x1024", [1, 64, 64], 1)):
        grids = torch.tensor([grid] * n_img)
        n = grid[1] * grid[2] * n_img
        imgs = [torch.randint(0, 256, (n, 768), dtype=torch.uint8, generator=g).cuda() for _ in range(4)]
        tower32 = copy.deepcopy(sessions["fc2 transposed"].model.visual).float()
        with torch.no_grad():
            ref32 = tower32(pixel_values(imgs[0], 2).float(), grids).float()
        del tower32
        rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
        res = {"rel_err_fp32": {}, "ms": {}}
        with torch.no_grad():
            feats = {name: s.graphs.encode(imgs[0], grids).float() for name, s in sessions.items()}
            for name, f in feats.items():
                res["rel_err_fp32"][name] = rel(f, ref32)
            res["rel_between"] = rel(feats["fc2 transposed"], feats["before"])
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
        print(label, {nm: (res["ms"][nm]["median"], round(res["rel_err_fp32"][nm], 5)) for nm in res["ms"]},
              "between", round(res["rel_between"], 5), flush=True)
    if path:
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
