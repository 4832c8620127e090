"""The plugin manager, and the registries it yields checked against the contracts.

`plugin_manager()` is built when a command runs (never at import time) and loads every entry point
of the group `dohnuts_bench`. The built-in plugins (the folder bench_plugins/, installed as the
package `dohnuts_bench_plugins`) are declared there in pyproject.toml, exactly as a third-party
package declares its own, and found the same way. Code that runs from a source checkout (a clone,
`pip install -e .`, or PYTHONPATH pointing at a checkout while another copy is installed) reads the
checkout's own pyproject.toml instead of whatever an install recorded: its entry points, loaded the
same way (`EntryPoint.load`), and its `package-dir`, so that `dohnuts_bench_plugins` is the
checkout's bench_plugins/ as an editable install maps it (`import_checkout_packages`).

`collect(pm, hook)` merges what a register hook returns and checks each object against its contract
(dohnuts.bench.contracts): a missing required member is a `PluginError` naming the object, and the
optional members are read once, into the entries below (`RegisteredKind`, `RegisteredTarget`), whose
attributes the runner, the CLI and workload validation read directly.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pluggy

from dohnuts.bench import hookspecs
from dohnuts.bench.contracts import (
    Launcher, PluginError, Target, TargetCapabilities, TargetFactory, TargetFactoryCapabilities, TelemetrySampler,
    TelemetrySamplerCapabilities, WorkloadKind, WorkloadKindCapabilities, capabilities, missing_members,
    protocol_members,
)
from dohnuts.errors import ConfigError, DohnutsError

ENTRY_POINT_GROUP = "dohnuts_bench"
DISTRIBUTION = "dohnuts"
# The repository root when dohnuts runs from a source checkout (it holds the pyproject.toml of
# `dohnuts`); an installed wheel's parent folder holds none.
CHECKOUT = Path(__file__).resolve().parents[2]


def plugin_manager(extra: tuple = ()) -> pluggy.PluginManager:
    """Every plugin of the `dohnuts_bench` entry points (built-in and third-party), then `extra`.
    A source checkout's own declarations come first: an install recorded elsewhere (another
    checkout's, an older one) registers only the names the checkout does not declare."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for ep in checkout_entry_points():  # none when dohnuts runs installed (from a wheel)
        pm.register(ep.load(), name=ep.name)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)  # skips the names registered above
    for plugin in extra:
        pm.register(plugin)
    return pm


def checkout_project(pyproject: Path | None = None) -> dict:
    """The parsed pyproject.toml of the source checkout dohnuts runs from ({} when it runs from an
    install, whose metadata then holds the declarations)."""
    pyproject = pyproject or CHECKOUT / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    try:
        # Python 3.11 and later (3.10 reads an install's metadata instead)
        import tomllib
    except ImportError:  # Python 3.10: what an install recorded (`pip install -e .` maps the plugins too)
        try:
            importlib.metadata.distribution(DISTRIBUTION)
            return {}
        except importlib.metadata.PackageNotFoundError:
            raise PluginError("dohnuts is not installed, and this Python cannot read the entry points of its "
                              "pyproject.toml (tomllib: Python 3.11): pip install -e .",
                              source=str(pyproject)) from None
    parsed = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return parsed if parsed.get("project", {}).get("name") == DISTRIBUTION else {}


def checkout_entry_points(pyproject: Path | None = None) -> list[importlib.metadata.EntryPoint]:
    """The `dohnuts_bench` entry points the source checkout declares ([] when dohnuts runs
    installed), its mapped packages made importable first (`import_checkout_packages`)."""
    pyproject = pyproject or CHECKOUT / "pyproject.toml"
    parsed = checkout_project(pyproject)
    if not parsed:
        return []
    import_checkout_packages(pyproject.parent, parsed)
    table = parsed["project"].get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return [importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()]


def import_checkout_packages(root: Path = CHECKOUT, parsed: dict | None = None) -> None:
    """Each package the checkout installs under another name than its folder's
    (`[tool.setuptools] package-dir`: `dohnuts_bench_plugins` is bench_plugins/) importable by
    that name, from this checkout, as `pip install -e .` maps it: the checkout's plugins, never
    a copy installed from somewhere else. Nothing when dohnuts runs installed."""
    parsed = checkout_project(root / "pyproject.toml") if parsed is None else parsed
    for name, folder in parsed.get("tool", {}).get("setuptools", {}).get("package-dir", {}).items():
        path = (root / folder).resolve()
        loaded = sys.modules.get(name)
        if name == "" or (loaded is not None and [Path(p).resolve() for p in loaded.__path__] == [path]):
            continue
        for stale in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[stale]  # a copy from elsewhere (an install of another checkout)
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


# -- registries ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RegisteredKind(WorkloadKindCapabilities):
    """A workload kind as the harness uses it: the plugin's object, its members resolved."""

    name: str
    plugin: WorkloadKind
    calls: Callable[..., list]


@dataclass(frozen=True, kw_only=True)
class RegisteredTarget(TargetFactoryCapabilities):
    """A target factory as the harness uses it, with its optional members resolved."""

    name: str
    factory: TargetFactory

    def options(self, raw: dict, *, source: str, field: str = "targets"):
        """The workload's `options:` for this target as its `Options` (types checked); an unknown
        key or a wrong type is one ConfigError naming the file and `field`."""
        known = [f.name for f in dataclasses.fields(self.Options)]
        if raw and not known:
            raise ConfigError(f"the {self.name} target takes no options", source=source, field=field)
        for key in raw:
            if key not in known:
                raise ConfigError(f"unknown {self.name} target option {key!r} (known: {sorted(known)})",
                                  source=source, field=field)
        try:
            return msgspec.convert(raw, self.Options, strict=True)
        except msgspec.ValidationError as exc:  # "Expected `int`, got `str` - at `$.lora_rank`"
            message, _, path = str(exc).partition(" - at `$")
            where = f"{field}{path.rstrip('`')}" if path else field
            if isinstance(exc.__cause__, DohnutsError):  # the Options' own check (e.g. an Invalid bound)
                cause = exc.__cause__
                where = f"{where}.{cause.field}" if cause.field and cause.source is None else where
                message = cause.message if cause.source is None else str(cause)
            raise ConfigError(f"{self.name} target option: {message[:1].lower()}{message[1:]}", source=source,
                              field=where) from None
        except DohnutsError as exc:  # the Options' own check of a file it names (e.g. an adapter)
            raise ConfigError(f"{self.name} target option: {exc}", source=source, field=field) from None

    def build(self, spec, device, dtype, options) -> tuple[Target, TargetCapabilities]:
        """The target built for one workload (`options`: an `Options` instance), checked against the
        Target contract, and its optional members."""
        target = self.factory(spec, device, dtype, options)
        what = f"target {self.name!r} ({origin(target)})"
        _require(target, Target, what)
        return target, capabilities(target, TargetCapabilities, what)


@dataclass(frozen=True, kw_only=True)
class RegisteredSampler(TelemetrySamplerCapabilities):
    """A telemetry sampler as the telemetry thread polls it."""

    name: str
    sample: Callable[[], dict]


def origin(obj: object) -> str:
    """Where a plugin object comes from, for errors: `module.QualName` (of its class, for an instance)."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if not isinstance(obj, (type, types.FunctionType, types.MethodType)):
        obj = type(obj)
    return f"{obj.__module__}.{obj.__qualname__}"


def _require(obj: object, contract: type, what: str) -> None:
    missing = missing_members(obj, contract)
    if missing:
        raise PluginError(f"has no {', '.join(f'`{m}`' for m in missing)}: a {contract.__name__} needs "
                          f"{_signatures(contract)} (dohnuts.bench.contracts.{contract.__name__})", source=what)


def _signatures(contract: type) -> str:
    out = []
    for name in protocol_members(contract):
        member = contract.__dict__.get(name)
        if callable(member):
            params = list(inspect.signature(member).parameters)[1:]
            out.append(f"{name}({', '.join(params)})")
        else:
            out.append(name)
    return ", ".join(out)


def register_kind(name: str, obj: object) -> RegisteredKind:
    what = f"workload kind {name!r} ({origin(obj)})"
    if not hasattr(obj, "Shape") and hasattr(obj, "fields"):
        raise PluginError("declares its shape with `fields`, which this version no longer reads: declare a frozen "
                          "msgspec Struct `Shape` (docs/plugins.md)", source=what)
    _require(obj, WorkloadKind, what)
    caps = capabilities(obj, WorkloadKindCapabilities, what)
    return RegisteredKind(name=name, plugin=obj, calls=obj.calls, **_values(caps))


def register_target(name: str, factory: object) -> RegisteredTarget:
    what = f"target {name!r} ({origin(factory)})"
    _require(factory, TargetFactory, what)
    if isinstance(factory, type):  # a class: what its instances must have is checked now, before any run
        _require(factory, Target, what)
    return RegisteredTarget(name=name, factory=factory, **_values(capabilities(factory, TargetFactoryCapabilities,
                                                                                what)))


def register_launcher(name: str, launcher: object) -> Launcher:
    _require(launcher, Launcher, f"launcher {name!r} ({origin(launcher)})")
    return launcher


def _values(caps) -> dict:
    return {f.name: getattr(caps, f.name) for f in dataclasses.fields(caps)}


REGISTER: dict[str, Callable[[str, object], object]] = {
    "dohnuts_bench_register_workload_kinds": register_kind,
    "dohnuts_bench_register_targets": register_target,
    "dohnuts_bench_register_launchers": register_launcher,
}


def collect(pm: pluggy.PluginManager, hook: str) -> dict:
    """Merge the dicts returned by a register hook, each object checked against its contract; a
    name registered twice is an error."""
    merged: dict = {}
    register = REGISTER.get(hook, lambda name, obj: obj)
    for result in getattr(pm.hook, hook)():
        for name, value in (result or {}).items():
            if name in merged:
                raise ValueError(f"two plugins register {hook.rsplit('_', 1)[-1].rstrip('s')} {name!r}")
            merged[name] = register(name, value)
    return merged


def samplers(pm: pluggy.PluginManager) -> list[RegisteredSampler]:
    """Every registered telemetry sampler, checked against its contract (available or not)."""
    out = []
    for group in pm.hook.dohnuts_bench_register_telemetry():
        for s in group or ():
            what = f"telemetry sampler ({origin(s)})"
            _require(s, TelemetrySampler, what)
            out.append(RegisteredSampler(name=s.name, sample=s.sample,
                                         **_values(capabilities(s, TelemetrySamplerCapabilities, what))))
    return out


def check_target_options(spec, targets: dict[str, RegisteredTarget]) -> None:
    """Every target entry's `options:` of a validated workload against its target's `Options`
    (before anything is measured; the error names the file and `targets[i].options`)."""
    for i, t in enumerate(spec.targets):
        targets[t.name].options(t.options, source=spec.file, field=f"targets[{i}].options")

