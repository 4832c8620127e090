"""Scratch (session 38): the tower as landed (its attention one Triton kernel, `ops.block_diagonal_attention`)
against the same tower with SDPA (`block_diagonal_attention_reference`), each its own 2b session's
`graphs.encode` (as a cold call runs it), taking turns by rounds; outputs against the FP32 tower.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s38/tower_ab.py OUT.json"""
import copy, json, statistics, sys
import numpy as np
import torch
import dohnuts
from dohnuts.model import vision as V
from dohnuts.ops.attention import block_diagonal_attention, block_diagonal_attention_reference
from dohnuts.runtime.images import pixel_values
from dohnuts.runtime.timing import StageTimer

LANDED = block_diagonal_attention
VARIANTS = {"sdpa": block_diagonal_attention_reference, "triton": block_diagonal_attention}

torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
sessions = {}
for name in VARIANTS:
    sessions[name] = dohnuts.load("qwen3.5-2b", device="cuda")
out = {}
for label, grid, n_img in (("448x448", [1, 28, 28], 1), ("4 x 448x448", [1, 28, 28], 4), ("512x512", [1, 32, 32], 1)):
    grids = torch.tensor([grid] * n_img)
    n = grid[1] * grid[2] * n_img
    imgs = [torch.randint(0, 256, (n, 768), dtype=torch.uint8, generator=g).cuda() for _ in range(4)]
    V.block_diagonal_attention = block_diagonal_attention_reference
    tower32 = copy.deepcopy(sessions["sdpa"].model.visual).float()
    with torch.no_grad():
        ref32 = tower32(pixel_values(imgs[0], 2).float(), grids).float()
    del tower32
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    res = {"rel_err_fp32": {}, "rel_err_landed": {}, "ms": {}}
    with torch.no_grad():
        feats = {}
        for name, s in sessions.items():
            V.block_diagonal_attention = VARIANTS[name]
            try:
                feats[name] = s.graphs.encode(imgs[0], grids).float()
            except Exception as exc:  # noqa: BLE001
                res["rel_err_fp32"][name] = f"{type(exc).__name__}: {exc}"[:200]
        for name, f in feats.items():
            res["rel_err_fp32"][name] = rel(f, ref32)
            res["rel_err_landed"][name] = rel(f, feats["sdpa"])
        times = {nm: [] for nm in feats}
        for rnd in range(8):
            order = list(feats) if rnd % 2 == 0 else list(reversed(list(feats)))
            for name in order:
                V.block_diagonal_attention = VARIANTS[name]
                for i in range(25):
                    timer = StageTimer(torch.device("cuda", 0))
                    with timer.stage("tower"):
                        sessions[name].graphs.encode(imgs[i % 4], grids)
                    times[name].append(timer.result()["tower"].device_ms)
    res["ms"] = {nm: {"median": round(statistics.median(v), 4), "p10": round(float(np.percentile(v, 10)), 4),
                      "p90": round(float(np.percentile(v, 90)), 4),
                      "round_medians": [round(statistics.median(v[i:i + 25]), 4) for i in range(0, len(v), 25)]}
                 for nm, v in times.items()}
    out[label] = res
    best = sorted(res["ms"], key=lambda nm: res["ms"][nm]["median"])
    print(label, {nm: (res["ms"][nm]["median"], round(res["rel_err_fp32"][nm], 5)) for nm in best}, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
