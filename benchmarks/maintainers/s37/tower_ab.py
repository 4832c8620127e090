"""Scratch (session 37): the vision tower as landed (add + LayerNorm fused, fc1's GELU in the GEMM's
epilogue, the grids' inputs computed once a graph; the pixels through a 256-value table) against
the tower before it (a copy of the old forwards and pixel arithmetic below) and against the new
tower with the old pixel arithmetic, each in its own 2b session's CUDA graph (`graphs.encode`, as
a cold call runs it), taking turns by rounds; outputs compared with each other and the FP32 tower.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s37/tower_ab.py OUT.json"""
import copy, json, statistics, sys
import numpy as np
import torch
import torch.nn.functional as F
import dohnuts
from dohnuts.model import vision as V
from dohnuts.runtime import graphs as G
from dohnuts.runtime.timing import StageTimer

NEW = {k: getattr(V, k).forward for k in ("VisionTower", "VisionBlock", "VisionMLP")}


def old_mlp(self, x):
    return self.linear_fc2(self.act(self.linear_fc1(x)))


def old_block(self, x, rope, seqlens):
    x = x + self.attn(self.norm1(x), rope, seqlens)
    return x + self.mlp(self.norm2(x))


def old_tower(self, patches, grid_thw, grid_inputs=None):
    grids = V._check_grids(grid_thw, self.cfg)
    x = self.patch_embed(patches)
    x = x + self.position_embeddings(grids).to(x.dtype)
    rope = self.rotary(grids, x.device)
    seqlens = [h * w for t, h, w in grids for _ in range(t)]
    for block in self.blocks:
        x = block(x, rope, seqlens)
    return self.merger(x)


NEW_PIXELS = G.pixel_values


def old_pixels(patches, temporal_patch_size, dtype=None):  # before: FP32 elementwise, cast by the tower
    N, row = patches.shape
    x = (patches.double() * (1 / 255)).float()
    x = (x - 0.5) / 0.5
    x = x.view(N, 3, 1, row // 3)
    return x.expand(N, 3, temporal_patch_size, row // 3).reshape(N, 3 * temporal_patch_size * (row // 3))


OLD = {"VisionTower": old_tower, "VisionBlock": old_block, "VisionMLP": old_mlp, "pixels": old_pixels}
TOWER = {**NEW, "pixels": old_pixels}
NEW = {**NEW, "pixels": NEW_PIXELS}
VARIANTS = {"before": OLD, "tower_only": TOWER, "landed": NEW}


def use(fns):
    for k, f in fns.items():
        if k == "pixels":
            G.pixel_values = f
        else:
            getattr(V, k).forward = f


torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
sessions = {}
for name, fns in VARIANTS.items():
    use(fns)
    sessions[name] = dohnuts.load("qwen3.5-2b", device="cuda")
vision = sessions["landed"].cfg.vision
grids = torch.tensor([[1, 28, 28]])
imgs = [torch.randint(0, 256, (784, 768), dtype=torch.uint8, generator=g).cuda() for _ in range(4)]
# the FP32 tower of the same weights, the old forwards (plain torch)
use(OLD)
tower32 = copy.deepcopy(sessions["landed"].model.visual).float()
with torch.no_grad():
    ref32 = tower32(old_pixels(imgs[0], 2), grids)
del tower32
out = {}
with torch.no_grad():
    feats = {}
    for name, s in sessions.items():
        use(VARIANTS[name])
        feats[name] = s.graphs.encode(imgs[0], grids).float()
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    out["rel_err"] = {"landed_vs_before": rel(feats["landed"], feats["before"]),
                      "landed_vs_tower_only": rel(feats["landed"], feats["tower_only"]),
                      **{f"{n}_vs_fp32": rel(f, ref32) for n, f in feats.items()}}
    print(out, flush=True)
    times = {n: [] for n in sessions}
    for rnd in range(8):
        for name, s in (sessions.items() if rnd % 2 == 0 else reversed(list(sessions.items()))):
            use(VARIANTS[name])
            for i in range(25):
                timer = StageTimer(torch.device("cuda", 0))  # the runtime's one GPU timer
                with timer.stage("tower"):
                    s.graphs.encode(imgs[i % 4], grids)
                times[name].append(timer.result()["tower"].device_ms)
out["ms"] = {n: {"median": round(statistics.median(v), 4), "p10": round(float(np.percentile(v, 10)), 4),
                 "p90": round(float(np.percentile(v, 90)), 4),
                 "round_medians": [round(statistics.median(v[i:i + 25]), 4) for i in range(0, len(v), 25)]}
             for n, v in times.items()}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
