"""Built-in analyzers of the machine: its load and its measured ceilings when a run starts
(`dohnuts_bench_prepare_run`: bench_plugins/analyzers/microbench.py, load.py), and its load as
telemetry while the run measures. The analysis of the records is the harness's own
(dohnuts.bench.analysis.run_sections, which `run` and `analyze` call directly)."""

from __future__ import annotations

from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report.status import log
from dohnuts_bench_plugins.analyzers.load import LoadSampler, load_before


@hookimpl
def dohnuts_bench_register_telemetry():
    return [LoadSampler()]


@hookimpl
def dohnuts_bench_prepare_run(run):
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch

    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    from dohnuts_bench_plugins.analyzers.microbench import measure_ceilings, measure_cpu_ceilings

    before = load_before()
    run.measured.setdefault("machine", {}).update(cpus=before["cpus"], threads=torch.get_num_threads(), before=before)
    log.info("load when the run started: other processes kept %.2f of %d cores busy (load average %.2f)",
             before["others_cores"] or 0.0, before["cpus"], before["load1"])
    if run.device.type != "cuda":
        log.info("measuring the CPU's ceilings on %d thread(s): fp32/bf16 matmul, fp32 vector, memory copy "
                 "(a few seconds)", torch.get_num_threads())
        run.measured["ceilings"] = measure_cpu_ceilings()
        return
    log.info("measuring ceilings: bf16 matmul (a burst, then 2 s sustained), device copy, host link, "
             "fp32 vector (FMA chains)")
    run.measured["ceilings"] = measure_ceilings(run.device)
