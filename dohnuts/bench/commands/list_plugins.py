"""`dohnuts-bench list`: the plugins, their hooks, the workload kinds (with their `shape:` fields),
the targets and the telemetry samplers (each available, or why not)."""

from __future__ import annotations

from rich.table import Table

from dohnuts.bench import plugins
from dohnuts.bench.measure.workload import shape_fields
from dohnuts.bench.plugins import collect, samplers
from dohnuts.bench.report.terminal import stdout_console


def setup_arguments(subparsers) -> None:
    ls = subparsers.add_parser("list", help="list plugins, workload kinds, targets and telemetry")
    ls.set_defaults(func=run)


def run(args) -> int:
    pm = plugins.plugin_manager()
    console = stdout_console()
    t = Table(title="dohnuts-bench plugins")
    t.add_column("plugin")
    t.add_column("hooks")
    for name, plugin in pm.list_name_plugin():
        t.add_row(str(name), ", ".join(h.name.removeprefix("dohnuts_bench_") for h in pm.get_hookcallers(plugin)))
    console.print(t)
    for hook, title in (("dohnuts_bench_register_workload_kinds", "workload kinds"),
                        ("dohnuts_bench_register_targets", "targets")):
        console.print(f"{title}: {', '.join(sorted(collect(pm, hook)))}")
    for name, kind in sorted(collect(pm, "dohnuts_bench_register_workload_kinds").items()):
        console.print(f"  {name} shape: " + "; ".join(shape_fields(kind)))
    console.print("telemetry: " + ", ".join(f"{s.name} ({s.unavailable or 'available'})" for s in samplers(pm)))
    return 0
