"""The plugin manager, and the registries it yields checked against the contracts.

`plugin_manager()` is built when a command runs (never at import time) and loads every entry point
of the group `dohnuts_bench`. The built-in plugins (dohnuts/bench/builtin/) are declared there in
pyproject.toml, exactly as a third-party package declares its own, and found the same way. A source
checkout that was never installed has no installed metadata: its entry points are then read from
the checkout's pyproject.toml — the same declarations, loaded the same way (`EntryPoint.load`).

`collect(pm, hook)` merges what a register hook returns and checks each object against its contract
(dohnuts.bench.contracts): a missing required member is a `PluginError` naming the object, and the
optional members are read once, into the entries below (`RegisteredKind`, `RegisteredTarget`), whose
attributes the runner, the CLI and workload validation read directly.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def plugin_manager(extra: tuple = ()) -> pluggy.PluginManager:
    """Every plugin of the `dohnuts_bench` entry points (built-in and third-party), then `extra`."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for ep in checkout_entry_points():  # none when dohnuts is installed
        if not pm.has_plugin(ep.name) and not pm.is_blocked(ep.name):
            pm.register(ep.load(), name=ep.name)
    for plugin in extra:
        pm.register(plugin)
    return pm


def checkout_entry_points(pyproject: Path | None = None) -> list[importlib.metadata.EntryPoint]:
    """The `dohnuts_bench` entry points a source checkout declares in its pyproject.toml, when the
    `dohnuts` distribution is not installed (installed, its metadata holds them: [])."""
    try:
        importlib.metadata.distribution(DISTRIBUTION)
        return []
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = pyproject or Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise PluginError("dohnuts is not installed, and this Python cannot read the entry points of its "
                          "pyproject.toml (tomllib: Python 3.11): pip install -e .", source=str(pyproject)) from None
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != DISTRIBUTION:
        return []
    table = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return [importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()]


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
        import msgspec

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

