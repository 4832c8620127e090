"""The built-in plugins of dohnuts-bench: workload kinds, targets, telemetry samplers, analyzers,
reporters and launchers, one package each. Installed as the package `dohnuts_bench_plugins` (the
folder keeps the design card's name; docs/architecture.md, "Packaging") and registered through
the `dohnuts_bench` entry points in pyproject.toml, exactly as a third-party plugin is. They use
the core's public API only (dohnuts.bench.contracts, sink, hookspecs)."""
