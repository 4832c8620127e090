"""The plugin manager: built on demand (never at import time), loading every entry point of
the `dohnuts_bench` group — the built-in plugins are registered by exactly that path."""

from __future__ import annotations

import importlib.metadata

import pluggy

from dohnuts.bench import hookspecs

ENTRY_POINT_GROUP = "dohnuts_bench"

# The built-in plugin modules, also declared as entry points in pyproject.toml. They are loaded
# through the entry points when the package is installed; this list is the fallback for a
# source checkout run without installation (e.g. `python -m dohnuts.bench.cli`).
BUILTIN = ("bench_plugins.workloads", "bench_plugins.targets", "bench_plugins.telemetry",
           "bench_plugins.analyzers", "bench_plugins.reporters", "bench_plugins.launchers")


def plugin_manager(extra: tuple = ()) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    names = {ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for mod in BUILTIN:
        if mod not in names:
            pm.register(importlib.import_module(mod), name=mod)
    for plugin in extra:
        pm.register(plugin)
    return pm


def collect(pm: pluggy.PluginManager, hook: str) -> dict:
    """Merge the dicts returned by a register hook; a name registered twice is an error."""
    merged: dict = {}
    for result in getattr(pm.hook, hook)():
        for name, value in (result or {}).items():
            if name in merged:
                raise ValueError(f"two plugins register {hook.rsplit('_', 1)[-1].rstrip('s')} {name!r}")
            merged[name] = value
    return merged
