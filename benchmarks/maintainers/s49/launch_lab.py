"""Session 49: does a CUDA graph's first kernel wait on the launch of the whole graph? From an idle
GPU (a single call's condition: the host busy 2 ms, the device done), the time from an event recorded
just before the replay to one recorded after it, with the graph launched whole against the same work
as a small head graph then the rest; beside it the same with the GPU kept busy before the first event
(a 3-ms kernel ahead of it: the launch hidden), the work's own time.

1. synthetic: chains of N element-wise kernels (N = 60, 250, 600; ~2 µs each), head = 8 kernels;
2. the 2b vision tower at 448² (784 patches), head = the patch embedding and the first block.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/launch_lab.py OUT.json
"""
import json
import statistics
import sys
import time

import torch


def busy_host(ms):
    t = time.perf_counter() + ms / 1e3
    while time.perf_counter() < t:
        pass


def measure(variants, reps=120):
    """variants: name → list of graphs replayed in order. Interleaved; medians in µs."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    big = torch.empty(64 << 20, device="cuda")
    out = {n: {"idle_us": [], "busy_us": [], "host_us": []} for n in variants}
    for rep in range(reps):
        for name, graphs in (variants.items() if rep % 2 else reversed(list(variants.items()))):
            for mode in ("idle_us", "busy_us"):
                torch.cuda.synchronize()
                busy_host(2.0)
                if mode == "busy_us":
                    torch.cuda._sleep(3_000_000)  # ≈ 2 ms of device time ahead of the first event
                e0.record()
                t0 = time.perf_counter()
                for g in graphs:
                    g.replay()
                out[name]["host_us"].append((time.perf_counter() - t0) * 1e6)
                e1.record()
                torch.cuda.synchronize()
                out[name][mode].append(e0.elapsed_time(e1) * 1e3)
    del big
    return {n: {k: round(statistics.median(v), 1) for k, v in d.items()} for n, d in out.items()}


def capture(fn, pool):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        fn()
    return g


def synthetic(pool):
    res = {}
    x = torch.zeros(1 << 18, device="cuda")
    for n in (60, 250, 600):
        def run(lo, hi):
            def f():
                for _ in range(lo, hi):
                    x.mul_(1.0001).add_(1e-4)
            return f
        k = n // 2  # two kernels an iteration
        whole = capture(run(0, k), pool)
        head, rest = capture(run(0, 4), pool), capture(run(4, k), pool)
        res[f"{n} kernels"] = measure({"whole": [whole], "head + rest": [head, rest]})
        print(n, res[f"{n} kernels"], flush=True)
    return res


def tower(pool, preset="qwen3.5-2b", device="cuda"):
    from dohnuts import api
    from dohnuts.model import vision as V
    from dohnuts.runtime.images import pixel_values

    s = api.load(preset, device=device, dtype=torch.bfloat16)
    visual, cfg = s.model.visual, s.model.visual.cfg
    grids = torch.tensor([[1, 28, 28]])
    row = cfg.in_channels * cfg.patch_size ** 2  # uint8 patches, one frame (pixel_values repeats it)
    patches = torch.randint(0, 255, (784, row), dtype=torch.uint8, device=device)
    gi = visual.grid_inputs(grids)
    pos, cos, sin = gi
    seqlens = [784]
    norms = [*(b.norm1 for b in visual.blocks), visual.merger.norm]
    state = {}

    def first(k):
        def f():
            px = pixel_values(patches, cfg.temporal_patch_size).to(torch.bfloat16)
            x = visual.patch_embed(px)
            h, x = V._add_norm(pos.to(x.dtype), x, norms[0])
            for block, nn_ in zip(visual.blocks[:k], norms[1:k + 1]):
                h, x = block(h, x, (cos, sin), seqlens, nn_)
            state["h"], state["x"] = h, x
        return f

    def rest(k):
        def f():
            h, x = state["h"], state["x"]
            for block, nn_ in zip(visual.blocks[k:], norms[k + 1:]):
                h, x = block(h, x, (cos, sin), seqlens, nn_)
            state[f"out{k}"] = visual.merger.project(h)
        return f

    def whole():
        state["whole"] = s.model.encode_images(pixel_values(patches, cfg.temporal_patch_size), grids, gi)

    with torch.inference_mode():
        g_whole = capture(whole, pool)
        g1 = capture(first(1), pool)
        g2 = capture(rest(1), pool)
        g1b = capture(first(4), pool)
        g2b = capture(rest(4), pool)
        res = measure({"whole": [g_whole], "embed + 1 block, rest": [g1, g2], "embed + 4 blocks, rest": [g1b, g2b]},
                      reps=150)
        g1.replay(); g2.replay(); g_whole.replay(); torch.cuda.synchronize()
        res["split_equals_whole"] = float((state["out1"].float() - state["whole"].float()).abs().max())
    print("tower", res, flush=True)
    return res


if __name__ == "__main__":
    pool = torch.cuda.graph_pool_handle()
    out = {"gpu": torch.cuda.get_device_name(0), "synthetic": synthetic(pool), "tower": tower(pool)}
    json.dump(out, open(sys.argv[1], "w"), indent=1)
