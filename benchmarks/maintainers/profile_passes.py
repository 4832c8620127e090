"""Where the time of a shared-prefix call goes: device time vs GPU busy time vs host launch time
of the prefix pass (1 × P), the forked suffix pass (B × S) and the unshared pass (B × (P + S)).

    python benchmarks/maintainers/profile_passes.py --preset qwen3.5-2b --batch 32 --prefix 448 --suffix 64 --out DIR

device_ms: CUDA events around the eager pass (includes GPU idle gaps); busy_ms: the sum of the
GPU kernel times torch.profiler saw (what the GPU actually worked); host_ms: the Python wall time
to issue the pass; graph_ms: CUDA events around a replay of the same pass captured as a CUDA graph
(what the runtime runs since issue 11); graph_host_ms: the host time to issue that replay.
busy << device ≈ host means the eager pass is launch-bound; graph_ms ≈ busy_ms means replay
removed the launch cost. The passes are those of a scoring call: the prefix computes only the state
it hands on, the suffix and full passes their last layer at `--scored` positions a row (0: every
position, as before 2026-12-01's sixth session).

Inside the replay: graph_busy_ms is the kernel time the profiler saw during one replay (the
per-kernel table is profile_<pass>_graph.txt, copies and memsets included), so graph_ms −
graph_busy_ms is idle time between the graph's kernels, and graph_busy_ms − gpu_busy_ms is the same
kernels running slower back to back than in the host-bound eager pass. sm_clock_mhz (median,
min) and power_w are NVML samples taken while the pass replays back to back for ~1 s, beside the
eager pass's (`eager_sm_clock_mhz`): the software power cap lowers the clock of dense sustained work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def measure(fn, repeat=5):
    """Median device and host (issue) milliseconds of `fn`: one stage of the runtime's timer each."""
    from dohnuts.runtime.timing import StageTimer

    dev, host = [], []
    for _ in range(repeat):
        torch.cuda.synchronize()
        timer = StageTimer(torch.device("cuda", torch.cuda.current_device()))
        with timer.stage("pass"):
            fn()
        t = timer.result()["pass"]
        dev.append(t.device_ms)
        host.append(t.host_ms)
    return statistics.median(dev), statistics.median(host)


def busy_ms(fn, out: Path, name: str):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # Only the kernels' own rows: an operator row repeats the device time of the kernels it
    # launched (summing every row counted the work twice — the 2026-11-30 run's `gpu_busy_ms`).
    busy = sum(ev.self_device_time_total for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    (out / f"profile_{name}.txt").write_text(
        events.table(sort_by="self_cpu_time_total", row_limit=25) + "\n\n"
        + events.table(sort_by="self_device_time_total", row_limit=15))
    return busy, sum(ev.count for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA)


def graph_busy_ms(g, out: Path, name: str) -> float:
    """Kernel (and memcpy/memset) time inside one replay of `g`, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    events = prof.key_averages()
    (out / f"profile_{name}_graph.txt").write_text(events.table(sort_by="self_device_time_total", row_limit=40))
    return sum(ev.self_device_time_total for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA) / 1e3


def clocks_while(fn, seconds: float = 1.0) -> dict:
    """The GPU clock (NVML's SM or amdsmi's GFX clock) and power sampled every 20 ms while `fn`
    runs back to back for `seconds`."""
    from dohnuts.bench.plugins import plugin_manager

    telemetry = plugin_manager().get_plugin("telemetry")  # the harness's own readers
    clock_mhz, own_gpu_sampler = telemetry.clock_mhz, telemetry.own_gpu_sampler

    nvml = own_gpu_sampler()
    if nvml.unavailable:
        return {"unavailable": nvml.unavailable}
    import threading

    samples, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            samples.append(nvml.sample())
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    torch.cuda.synchronize()
    t.start()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
        torch.cuda.synchronize()
    stop.set()
    t.join()
    busy = samples[len(samples) // 5:] or samples  # skip the ramp
    clk = sorted(clock_mhz(x) for x in busy)
    pw = sorted(x["power_w"] for x in busy)
    capped = sum(1 for x in busy if x.get("power_capped"))
    return {"sm_clock_mhz": clk[len(clk) // 2], "sm_clock_min_mhz": clk[0], "power_w": pw[len(pw) // 2],
            "power_capped_samples": f"{capped}/{len(busy)}", "runs": n}


def matmul_burst_vs_sustained(n: int = 8192, seconds: float = 3.0) -> dict:
    """The harness's ceiling microbenchmark (BF16 n³ matmul, median of 10 after 3 warm-ups: a burst
    of ~20 ms) against the same matmul back to back for `seconds` (median of the last half), with
    the clock and power sampled: what a long pass can sustain under the power cap."""
    from dohnuts.runtime.timing import StageTimer, device_times_ms

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    flop = 2 * n ** 3
    torch.cuda.synchronize()
    time.sleep(1.0)  # let the clock recover from the passes before the burst
    burst = statistics.median(device_times_ms(lambda: a @ b, warmup=3, repeat=10))
    timer = StageTimer(torch.device("cuda", torch.cuda.current_device()))

    def one():
        with timer.stage("matmul"):
            a @ b

    clocks = clocks_while(one, seconds)
    times = timer.device_ms_each("matmul")
    tail = times[len(times) // 2:]
    sustained = statistics.median(tail)
    return {"burst_tflops": flop / burst / 1e9, "sustained_tflops": flop / sustained / 1e9,
            "sustained_clocks": clocks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3.5-2b")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prefix", type=int, default=448)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--scored", type=int, default=4,
                   help="scored positions a row (the last ones), as a scoring pass computes its last layer; "
                        "0: whole passes (every position's hidden state)")
    p.add_argument("--out", default=".")
    a = p.parse_args(argv)
    from dohnuts.config import preset
    from dohnuts.model.build import build_text_backbone

    out = Path(a.out)
    cfg = preset(a.preset)
    model, _ = build_text_backbone(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    from dohnuts.model.packing import fuse_projections

    fuse_projections(model)  # as a prediction session runs it: packed projections
    g = torch.Generator(device="cuda").manual_seed(0)
    full = torch.randint(0, 200000, (a.batch, a.prefix + a.suffix), device="cuda", generator=g)
    full[:, : a.prefix] = full[0, : a.prefix]
    pre, suf = full[:1, : a.prefix], full[:, a.prefix:]
    res = {"preset": a.preset, "batch": a.batch, "prefix": a.prefix, "suffix": a.suffix, "scored": a.scored,
           "device": torch.cuda.get_device_name()}

    def rows(length: int):  # the last `scored` positions of every row, or None: every position
        if not a.scored:
            return None
        return torch.arange(length - a.scored, length, device="cuda").expand(a.batch, -1).contiguous()

    suf_rows, full_rows = rows(a.suffix), rows(a.prefix + a.suffix)
    only = bool(a.scored)  # a scoring prefix pass computes only the state it hands on
    with torch.inference_mode():
        _, state = model(pre, return_state=True)
        forked = state.fork(a.batch)
        passes = {
            "prefix_1xP": lambda: model(pre, return_state=True, state_only=only),
            "fork": lambda: state.fork(a.batch),
            "suffix_BxS": lambda: model(suf, state=forked, rows=suf_rows),
            "full_Bx(P+S)": lambda: model(full, rows=full_rows),
            # the prefix's rows in the suffixes' token-parallel ops, one pass (the runtime's default)
            "shared_1xP+BxS": lambda: model.forward_shared(model.embed_tokens(pre), model.embed_tokens(suf),
                                                           rows=suf_rows),
        }
        for _ in range(3):
            for fn in passes.values():
                fn()
        for name, fn in passes.items():
            d, h = measure(fn)
            b, n = busy_ms(fn, out, name.split("_")[0])
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            gd, gh = measure(g.replay)
            gb = graph_busy_ms(g, out, name.split("_")[0])
            res[name] = {"device_ms": d, "host_ms": h, "gpu_busy_ms": b, "kernels": n, "graph_ms": gd,
                         "graph_host_ms": gh, "graph_busy_ms": gb}
            res[name]["graph_clocks"] = clocks_while(g.replay)
            res[name]["eager_clocks"] = clocks_while(fn)
            del g
            print(name, {k: round(v, 2) if isinstance(v, float) else v for k, v in res[name].items()}, flush=True)
    res["bf16_matmul_8192"] = matmul_burst_vs_sustained()
    print("bf16_matmul_8192", res["bf16_matmul_8192"], flush=True)
    (out / "profile_passes.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
