"""Session 49: where a single cold call's vision stage spends its host time before the tower's graph
replays (M62: the stage 1.931 ms against the graph's 1.761 from an idle GPU). A 2b session, the
image-cache-cold-2b request, cold calls (the cache forgotten, the preparation redone, 20 ms of host
busy-wait before each stage, as a single call's host waits on the device): host µs from the stage's
start to entering `ImageFeatureCache.features`, `_encode`, `PassGraphs.encode`, `_replay` and the
graph's replay; then the stage's device time (the harness's StageTimer). Two variants taking turns
call by call: the tree's `Session.image_features` and `PassGraphs.encode`, and the code before
(1b0edfd's, copied below).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/vision_host.py OUT.json
"""
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(path):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime import graphs as G
    from dohnuts.runtime import image_cache as IC
    from dohnuts.runtime.images import ImageKeyMemo
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.runtime.timing import StageTimer
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/image-cache-cold-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    tmp = tempfile.mkdtemp()
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                   random.Random(spec.seed)))
    s = api.load(spec.model, device="cuda")
    pipe = Pipeline(s.device, workers=1)
    req = calls[0].request
    time.sleep(ImageKeyMemo.RACY_S)
    marks = {}

    def wrap(owner, name, key):
        f = getattr(owner, name)

        def w(*a, **k):
            marks[key] = time.perf_counter()
            return f(*a, **k)
        setattr(owner, name, w)

    wrap(IC.ImageFeatureCache, "features", "features")
    wrap(IC.ImageFeatureCache, "_encode", "_encode")
    wrap(G.PassGraphs, "encode", "graphs.encode")
    wrap(G.PassGraphs, "_replay", "_replay")
    wrap(torch.cuda.CUDAGraph, "replay", "graph.replay")
    steps = ["features", "_encode", "graphs.encode", "_replay", "graph.replay"]
    from dohnuts.runtime import session as S
    variants = {"tree": (S.Session.image_features, G.PassGraphs.encode), "before": (_old_image_features, None)}
    res = {}
    tree_encode = G.PassGraphs.encode  # the wrapped one
    for name in variants:
        res[name] = {"host": {k: [] for k in steps + ["stage"]}, "device": []}
    with torch.inference_mode():
        for i in range(340):
            name = "tree" if i % 2 else "before"
            S.Session.image_features = variants[name][0]
            G.PassGraphs.encode = tree_encode if name == "tree" else _old_graphs_encode_wrapped(marks)
            host, device = res[name]["host"], res[name]["device"]
            s.forget_images()
            hb = s.prepare(req)
            dev, ready = pipe.transfer(hb)
            pipe.wait(dev, ready)
            torch.cuda.synchronize()
            t = time.perf_counter() + 0.02
            while time.perf_counter() < t:
                pass
            timer = StageTimer(torch.device("cuda"))
            t0 = time.perf_counter()
            with timer.stage("vision"):
                s.image_features([(hb, dev)])
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            if i >= 40:
                for k in steps:
                    host[k].append((marks[k] - t0) * 1e6)
                host["stage"].append((t1 - t0) * 1e6)
                device.append(timer.device_ms_each("vision")[0])
    out = {"gpu": torch.cuda.get_device_name(0), "calls_each": len(res["tree"]["device"])}
    for name, r in res.items():
        out[name] = {"host_us_from_stage_start": {k: round(statistics.median(v), 1) for k, v in r["host"].items()},
                     "vision_stage_device_ms": round(statistics.median(r["device"]), 4),
                     "vision_stage_device_ms_p10_p90": [round(statistics.quantiles(r["device"], n=10)[0], 4),
                                                        round(statistics.quantiles(r["device"], n=10)[-1], 4)]}
    print(json.dumps(out), flush=True)
    json.dump(out, open(path, "w"), indent=1)


def _old_image_features(self, batches):
    """1b0edfd's `Session.image_features`, verbatim but for its imports."""
    from dohnuts.runtime.images import pixel_values, prepare_image
    from dohnuts.runtime.session import ImageUse

    imgs = [hb.image for hb, _ in batches if hb.image is not None]
    if not imgs:
        return [None] * len(batches)
    imgs = [img if img.patches is not None or img.key in self.image_cache
            else prepare_image(img.source, self.cfg.vision, device=self.device) for img in imgs]
    staged = {hb.image.key: dev.pixel_patches for hb, dev in batches
              if hb.image is not None and dev is not None and dev.pixel_patches is not None}
    encodes, seen = [], set()
    for img in imgs:
        encodes.append(img.key not in self.image_cache and img.key not in seen)
        seen.add(img.key)

    def encode(patches, grids):
        patches = patches.to(self.device, non_blocking=True)
        if self.graphs is not None:
            return self.graphs.encode(patches, grids)
        return self.model.encode_images(pixel_values(patches, self.cfg.vision.temporal_patch_size), grids)

    with torch.no_grad():
        feats = iter(zip(self.image_cache.features(imgs, encode, staged), encodes, imgs))
    out = []
    for hb, _ in batches:
        if hb.image is None:
            out.append(None)
            continue
        f, encoded, img = next(feats)
        out.append(ImageUse(f, img.patch_count if encoded else 0))
    return out


def _old_graphs_encode_wrapped(marks):
    """1b0edfd's `PassGraphs.encode` (its key built int by int), with the same entry mark."""
    from dohnuts.runtime.images import pixel_values

    def encode(self, patches, grids):
        marks["graphs.encode"] = time.perf_counter()
        temporal = self.model.cfg.vision.temporal_patch_size
        key = ("vision", tuple(tuple(int(v) for v in g) for g in grids.tolist()))
        static = self._buffer("patches", patches)
        static.copy_(patches)
        held: list = []

        def fn():
            if not held:
                visual = self.model.visual
                held.append(None if visual is None else visual.grid_inputs(grids))
            return self.model.encode_images(pixel_values(static, temporal), grids, held[0])

        g = self._replay(key, fn)
        if g is None:
            return self.model.encode_images(pixel_values(patches, temporal), grids)
        return g.output.clone()
    return encode


if __name__ == "__main__":
    main(sys.argv[1])
