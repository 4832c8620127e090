"""Session 53 (scratch, branch early-tower-s53): a single cold image call with the tower started on
the preparing thread's stream right after the image's unfilter — its captured graph replayed there,
the features put into the cache under the content key once `finish` knows it, so that the vision
stage finds them — against main's (the tower replayed on the compute stream in the vision stage).
Two 2b sessions of one seed, image-cache-cold-2b's requests, every image forgotten before each call
(as the harness's cold workload does), taking turns call by call: walls, stages (device and host
ms), and the scores' largest difference (expected 0: the same graph, the same inputs).

Only where the tower's graph is captured already (the warm-up calls run main's path and capture
it): no capture is attempted from the preparing path. The early form's `finish` waits on an event
after the pixels' copy back instead of the whole stream, so the host does not wait for the tower.
Its calls report no encode (a hit): the work counts are not comparable, the walls are.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s53/early_tower_ab.py OUT.json [CALLS_EACH]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import torch

WORKLOAD = "workloads/gpu/image-cache-cold-2b.yaml"
COUNTS = {"early": 0, "not_early": 0}


def q(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    return {"median": round(statistics.median(v), 4), "p10": round(v[len(v) // 10], 4),
            "p90": round(v[(len(v) * 9) // 10], 4), "n": len(v)}


def early_tower(sess) -> None:
    """Patch one session (instance attributes only: the other session runs main's code)."""
    from dohnuts.runtime.session import Session

    lock = threading.Lock()
    last: list = [None]  # the previous early replay's event: the static buffers' next user waits on it
    early: dict[str, torch.cuda.Event] = {}  # key → the event after its tower, until the vision stage

    def start_image(self, path):
        pending, digest = Session._start_image(self, path)
        image = pending.image
        stream = getattr(pending, "_stream", None)
        graphs = self.graphs
        why = ("buffers" if pending._buffers is None else "stream" if stream is None else "graphs" if graphs is None
               else "patches" if image.patches is None or not image.patches.is_cuda else None)
        if why is not None:
            COUNTS["not_early"] += 1
            COUNTS[why] = COUNTS.get(why, 0) + 1
            return pending, digest
        grids = torch.tensor([image.grid_thw], dtype=torch.long)
        if ("vision", tuple(map(tuple, grids.tolist()))) not in graphs._graphs:
            COUNTS["not_early"] += 1
            COUNTS["uncaptured"] = COUNTS.get("uncaptured", 0) + 1  # not captured yet: main's path captures it on the compute thread
            return pending, digest
        px_done = torch.cuda.Event()
        px_done.record(stream)  # after the unfilter, the patches and the pixels' copy back
        with lock, torch.cuda.stream(stream), torch.inference_mode():  # prepare runs outside it
            if last[0] is not None:
                stream.wait_event(last[0])
            feats = graphs.encode(image.patches, grids)  # the static copy, the replay, the clone: this stream
            done = torch.cuda.Event()
            done.record(stream)
            last[0] = done
        COUNTS["early"] += 1
        pending.wait = px_done.synchronize  # the pixels back: the key needs no more (the buffers' last use)
        orig_finish = pending.finish

        def finish():
            img = orig_finish()
            with lock:
                if img.key not in self.image_cache:
                    self.image_cache._insert(img.key, feats)
                    early[img.key] = done
            return img

        pending.finish = finish
        return pending, digest

    def image_features(self, batches):
        cur = torch.cuda.current_stream()
        with lock:
            for hb, _ in batches:
                img = hb.image
                if img is not None and img.key in early:
                    cur.wait_event(early.pop(img.key))
                    if img.key in self.image_cache:
                        self.image_cache._entries[img.key].record_stream(cur)
        return Session.image_features(self, batches)

    def forget_images(self):
        with lock:
            early.clear()
        Session.forget_images(self)

    sess._start_image = types.MethodType(start_image, sess)
    sess.image_features = types.MethodType(image_features, sess)
    sess.forget_images = types.MethodType(forget_images, sess)


def main(path, calls_each):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.predict import Predictor
    from dohnuts.runtime.timing import StageTimer
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(WORKLOAD, kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tempfile.mkdtemp()),
                                                   random.Random(spec.seed)))
    reqs = [c.request for c in calls]
    preds = {}
    for name in ("main", "early"):
        torch.manual_seed(0)
        sess = api.load(spec.model, device="cuda")
        if name == "early":
            early_tower(sess)
        preds[name] = Predictor(sess)
        for i in range(4):  # the first captures the tower's graph (main's path), the rest run the variant
            sess.forget_images()
            preds[name].call(reqs[i % len(reqs)])
    torch.cuda.synchronize()
    COUNTS.clear(); COUNTS.update(early=0, not_early=0)
    res = {n: {"wall_ms": [], "host": {}} for n in preds}
    scores = {n: None for n in preds}
    order = list(preds)
    for i in range(2 * calls_each):
        name = order[i % 2] if (i // 2) % 2 == 0 else order[1 - i % 2]
        sess = preds[name].session
        sess.forget_images()  # a cold call: the file read, hashed and decoded, the tower run
        timer = StageTimer(torch.device("cuda"))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result, _ = preds[name].call(reqs[(i // 2) % len(reqs)], timer)
        torch.cuda.synchronize()
        res[name]["wall_ms"].append((time.perf_counter() - t0) * 1e3)
        for stage, r in timer.result().items():
            res[name].setdefault(stage, []).append(r.device_ms)
            res[name]["host"].setdefault(stage, []).append(r.host_ms)
        if (i // 2) % len(reqs) == 0 and scores[name] is None:
            scores[name] = [s for qr in result.questions for s in qr.scores]
    out = {"gpu": torch.cuda.get_device_name(0), "calls_each": calls_each, "counts": dict(COUNTS),
           "variants": {n: {k: (q(v) if k != "host" else {s: q(x) for s, x in v.items()}) for k, v in r.items()}
                        for n, r in res.items()}}
    a, b = (torch.tensor(scores[n], dtype=torch.float64) for n in ("early", "main"))
    out["scores_max_abs_diff"] = float((a - b).abs().max())
    for p in preds.values():
        p.close()
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    v = out["variants"]
    print({n: (v[n]["wall_ms"]["median"], v[n]["host"]["prepare"]["median"], (v[n].get("vision") or {}).get("median"))
           for n in v}, "counts", COUNTS, "scores diff", out["scores_max_abs_diff"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 150)
