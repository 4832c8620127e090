"""Session 50, this CPU: (1) `collate` of the tree against bfde253's (`batch_before.py`), alone and
followed by `Batch.packed` (what `pin` did on CUDA), for three GPU workloads' first requests (the
tiny preset: the byte tokenizer, the workloads' GPU sizes), taking turns, each after a 2-ms busy
wait; (2) 32 prediction results built as the tree's msgspec Structs against frozen dataclasses;
(3) a text-2b batch's six integer tensors handed out as torch views of one buffer (the tree) against
`from_numpy` views of its numpy view (the form call 3's lab measured).
Medians in µs.

    .venv/bin/python benchmarks/maintainers/s50/cpu_host_ab.py
"""
import dataclasses
import random
import statistics
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def busy(s):
    t = time.perf_counter() + s
    while time.perf_counter() < t:
        pass


def collate_ab(workloads):
    import batch_before as OB

    import dohnuts
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime import batch as NB
    from dohnuts.runtime.session import image_head_positions
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    cfg, ckpt = resolve_source("tiny")
    s = dohnuts.load("tiny")
    for w in workloads:
        spec = dataclasses.replace(load_workload(w, kinds, targets, gpu=True), model="tiny")
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tempfile.mkdtemp()),
                                                       random.Random(spec.seed)))
        req = calls[0].request
        if req.image is not None:
            time.sleep(2)
        hb = s.prepare(req)
        plan, image = hb.plan, hb.image
        pos = None if image is None else image_head_positions(image.grid_thw, image.token_count, max(plan.lengths),
                                                               cfg.image_token_id, cfg.vision.spatial_merge_size)
        fns = {"before": lambda: OB.collate(plan, pad_id=256, image=image, positions=pos),
               "before+packed": lambda: OB.collate(plan, pad_id=256, image=image, positions=pos).tensors.packed(),
               "tree": lambda: NB.collate(plan, pad_id=256, image=image, positions=pos)}
        res = {k: [] for k in fns}
        for i in range(3000):
            k = list(fns)[i % 3]
            busy(0.002)
            t0 = time.perf_counter()
            fns[k]()
            res[k].append((time.perf_counter() - t0) * 1e6)
        print(w, {k: round(statistics.median(v), 1) for k, v in res.items()})


def results_ab():
    from dohnuts.runtime.predict import QuestionResult

    @dataclass(frozen=True)
    class Frozen:
        id: str
        scores: list
        probabilities: list
        choice: int

    v = [0.1, 0.2, 0.3, 0.4]
    for cls in (Frozen, QuestionResult):
        t = timeit.timeit(lambda: [cls(id="q", scores=v[:4], probabilities=v[:4], choice=1) for _ in range(32)],
                          number=20000) / 20000 * 1e6
        print(f"32 results as {cls.__name__}: {t:.1f} µs")


def views_ab():
    import torch

    sizes = [16384, 128, 128, 128, 128, 128]
    shapes = [(32, 512), (128,), (32, 4), (32, 4), (128,), (128,)]
    buf = torch.empty(sum(sizes), dtype=torch.long)
    flat = buf.numpy()

    def from_numpy():
        o = 0
        for n, sh in zip(sizes, shapes):
            torch.from_numpy(flat[o:o + n].reshape(sh))
            o += n

    def torch_views():
        o = 0
        for n, sh in zip(sizes, shapes):
            buf[o:o + n].view(sh)
            o += n

    for f in (from_numpy, torch_views):
        print(f"six tensors as {f.__name__}: {timeit.timeit(f, number=20000) / 20000 * 1e6:.1f} µs")


if __name__ == "__main__":
    collate_ab(["workloads/gpu/text-2b.yaml", "workloads/gpu/shared-prefix-2b.yaml",
                "workloads/gpu/image-cache-warm-2b.yaml"])
    results_ab()
    views_ab()
