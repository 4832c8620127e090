"""The plugin contracts (dohnuts.bench.contracts): the built-ins are found through their entry
points only; a plugin object missing a required member, or with an optional one of the wrong
type, is refused in one line before anything is measured; target options are typed; the record
sink is the public way to write records; the plugins use no private name of the core; one GPU
timer; optional members are read in one place."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from dohnuts.bench.calls import CallResult
from dohnuts.bench.contracts import CONTRACTS, NoOptions, PluginError, TargetCapabilities, WorkloadKindCapabilities
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.plugins import collect, plugin_manager, register_kind, register_target, samplers
from dohnuts.bench.analysis.records import encode_record
from dohnuts.bench.sink import RecordSink
from dohnuts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ROOT / "bench_plugins"  # the built-in plugins, installed as the package `dohnuts_bench_plugins`
tomllib = pytest.importorskip("tomllib")  # Python 3.11


def _declared_entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"]["dohnuts_bench"]


# -- built-ins through the entry points --------------------------------------------------------------


def test_every_builtin_is_found_through_its_entry_point():
    declared = _declared_entry_points()
    assert set(declared) == {"workloads", "targets", "telemetry", "analyzers", "reporters", "launchers"}
    pm = plugin_manager()  # a source checkout reads its pyproject (an install's metadata: tests/test_packaging.py)
    for name, module in declared.items():
        assert pm.get_plugin(name) is importlib.import_module(module), name
        assert BUILTIN in Path(pm.get_plugin(name).__file__).parents, name  # this checkout's, whatever is installed
    # and no code of the core names a built-in module: the entry points are the only path
    for path in sorted((ROOT / "dohnuts").rglob("*.py")):
        tree = ast.parse(path.read_text())
        named = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and n.value.split(".")[0] in ("dohnuts_bench_plugins", "bench_plugins")]
        named += [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                  and any(m.split(".")[0] in ("dohnuts_bench_plugins", "bench_plugins")
                          for m in [getattr(n, "module", None) or ""] + [a.name for a in n.names])]
        assert not named, f"{path.relative_to(ROOT)}:{named}"


def test_a_source_checkout_finds_the_builtins_through_its_pyproject(monkeypatch):
    """Not installed (no distribution metadata at all): the entry points are read from the
    checkout's pyproject.toml and loaded the same way."""
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: iter(()))
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    pm = plugin_manager()
    assert {name for name, _ in pm.list_name_plugin()} == set(_declared_entry_points())
    assert "text" in collect(pm, "dohnuts_bench_register_workload_kinds")


# -- contracts checked at collection -----------------------------------------------------------------


class _EchoShape(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    n: int = 1


class _Echo:
    Shape = _EchoShape

    def calls(self, ctx):
        return []


class _Target:
    def __init__(self, spec, device, dtype, options):
        self.options = options

    def run_call(self, call, timer):
        return CallResult(decisions=0, work=None)

    def close(self):
        pass


class _NoClose:
    def __init__(self, spec, device, dtype, options):
        pass

    def run_call(self, call, timer):
        return None


class _Registers:
    """A plugin registering the objects it is given."""

    def __init__(self, kinds=None, targets=None):
        self.kinds, self.targets = kinds or {}, targets or {}

    @hookimpl
    def dohnuts_bench_register_workload_kinds(self):
        return self.kinds

    @hookimpl
    def dohnuts_bench_register_targets(self):
        return self.targets


def test_a_target_missing_a_required_member_is_refused():
    pm = plugin_manager(extra=(_Registers(targets={"acme": _NoClose}),))
    with pytest.raises(PluginError) as info:
        collect(pm, "dohnuts_bench_register_targets")
    message = str(info.value)
    assert message.startswith("target 'acme' (tests.bench.test_contracts._NoClose): has no `close`")
    assert "run_call(call, timer), close()" in message and "\n" not in message


def test_a_built_target_is_checked_too():
    """A factory that is a function can only be checked once it has built its target."""
    entry = register_target("acme", lambda spec, device, dtype, options: object())
    with pytest.raises(PluginError, match=r"target 'acme' \(builtins.object\): has no `run_call`, `close`"):
        entry.build(None, None, None, NoOptions())
    target, caps = register_target("ok", _Target).build(None, None, None, NoOptions())
    assert caps == TargetCapabilities()  # every optional member at its default


def test_a_kind_missing_calls_or_with_a_wrong_optional_member_is_refused():
    class NoCalls:
        Shape = _EchoShape

    with pytest.raises(PluginError, match=r"workload kind 'x' \(.*NoCalls\): has no `calls`"):
        register_kind("x", NoCalls())

    class Wrong(_Echo):
        collective = "yes"

    with pytest.raises(PluginError, match=r"`collective` must be a bool, got 'yes'"):
        register_kind("x", Wrong())

    class NotAStruct(_Echo):
        Shape = dict

    with pytest.raises(PluginError, match=r"`Shape` must be a msgspec Struct class, got <class 'dict'>"):
        register_kind("x", NotAStruct())

    class OldFields:  # the declaration of earlier versions
        fields = {"n": int}

        def calls(self, ctx):
            return []

    with pytest.raises(PluginError, match=r"declares its shape with `fields`.*msgspec Struct `Shape`"):
        register_kind("x", OldFields())


def test_optional_members_take_their_declared_defaults():
    entry = register_kind("echo", _Echo())
    assert entry.sequence_tokens is None and entry.collective is False and entry.distributed is True
    assert entry.validate is None and entry.Shape is _EchoShape
    assert entry.warmup_every_call(None) is False
    assert {f: getattr(entry, f) for f in ("collective", "distributed")} == {
        f: getattr(WorkloadKindCapabilities(), f) for f in ("collective", "distributed")}
    target = register_target("plain", _Target)
    assert target.Options is NoOptions and target.kinds is None and target.unavailable() is None


def test_the_builtins_keep_their_contracts():
    pm = plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    assert kinds["train-step"].collective is True and kinds["text"].collective is False
    assert kinds["image-cache"].warmup_every_call is not None and kinds["text"].sequence_tokens is not None
    assert targets["transformers"].kinds == ("text", "shared-prefix") and targets["transformers"].Options is NoOptions
    assert {s.name for s in samplers(pm)} == {"host", "nvml", "amdsmi", "load"}
    assert set(collect(pm, "dohnuts_bench_register_launchers")) == {"torchrun"}


def test_a_plugin_error_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from dohnuts.bench import plugins
    from dohnuts.bench.cli import main

    real = plugins.plugin_manager
    monkeypatch.setattr(plugins, "plugin_manager", lambda extra=(): real(extra=(_Registers(
        targets={"acme": _NoClose}), *extra)))
    path = tmp_path / "w.yaml"
    path.write_text("kind: text\nmodel: tiny\n")
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "target 'acme'" in err[0] and "has no `close`" in err[0]
    assert not (tmp_path / "runs").exists()


# -- typed target options ------------------------------------------------------------------------------


def test_target_options_are_typed():
    targets = collect(plugin_manager(), "dohnuts_bench_register_targets")
    dohnuts = targets["dohnuts"]
    options = dohnuts.options({"share_prefix": False, "lora_rank": 8}, source="w.yaml")
    assert (options.share_prefix, options.lora_rank, options.cuda_graphs, options.adapter) == (False, 8, True, None)
    assert dohnuts.options({}, source="w.yaml") == dohnuts.Options()
    cases = [({"bogus": 1}, "w.yaml: field 'targets[1].options': unknown dohnuts target option 'bogus' "
                            "(known: ['adapter', 'cuda_graphs', 'lora_rank', 'share_prefix'])"),
             ({"lora_rank": True}, "w.yaml: field 'targets[1].options.lora_rank': dohnuts target option: "
                                   "expected `int`, got `bool`"),
             ({"adapter": 3}, "field 'targets[1].options.adapter'")]
    for raw, message in cases:
        with pytest.raises(ConfigError) as info:
            dohnuts.options(raw, source="w.yaml", field="targets[1].options")
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"w.yaml: field 'targets': the transformers target takes no options"):
        targets["transformers"].options({"x": 1}, source="w.yaml")


def test_a_third_party_target_declares_its_options():
    @dataclass(frozen=True)
    class Options:
        depth: float = 0.5
        mode: str = "fast"

    class Acme(_Target):
        pass

    Acme.Options = Options
    entry = register_target("acme", Acme)
    target, _ = entry.build(None, None, None, entry.options({"mode": "slow"}, source="w.yaml"))
    assert target.options == Options(mode="slow")
    with pytest.raises(ConfigError, match="unknown acme target option 'speed'"):
        entry.options({"speed": 1}, source="w.yaml")

    class NotADataclass(_Target):
        Options = dict

    with pytest.raises(PluginError, match=r"`Options` must be a dataclass, got <class 'dict'>"):
        register_target("acme", NotADataclass)


# -- the record sink ------------------------------------------------------------------------------------


def test_the_record_sink_writes_strict_json_lines_flushed_at_once(tmp_path):
    from tests.bench.typed_records import typed

    path = tmp_path / "r.jsonl"
    a, b, c = (typed({"workload": {"name": "w"}, "target": "t", "wall_ms": 1.0, "iteration": i}) for i in range(3))
    a.extra["x"], b.extra["y"] = math.nan, [math.inf, 2.0]
    with RecordSink.open(path) as out:
        out.write(a)
        assert path.read_text() == encode_record(a) + "\n"  # on disk before the sink is closed
        out.write(b)
    with RecordSink.open(path) as out:  # appends
        out.write(c)
        assert out.written == 1
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["iteration"], r["extra"]) for r in lines] == [(0, {"x": None}), (1, {"y": [None, 2.0]}), (2, {})]


def _imported_names(path: Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dohnuts":
            out += [(node.module, a.name) for a in node.names]
    return out


def test_plugins_import_no_private_name_of_the_core():
    """The built-ins use the core's public API only (the launcher once imported the runner's `_write`)."""
    private = [(str(p.relative_to(ROOT)), module, name) for p in sorted(BUILTIN.rglob("*.py"))
               for module, name in _imported_names(p) if name.startswith("_")]
    assert not private


# -- one GPU timer; optional members read in one place ---------------------------------------------------


def test_only_the_runtime_timer_records_timing_events():
    """Every CUDA timing event of the project is created by dohnuts/runtime/timing.py."""
    found = []
    for folder in ("dohnuts", "bench_plugins", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "enable_timing" in path.read_text():
                found.append(str(path.relative_to(ROOT)))
    assert found == ["dohnuts/runtime/timing.py"]


# workload.py (being moved to msgspec on another branch) still spells three reads of the registered
# entries' attributes as getattr; they always find them (RegisteredKind, RegisteredTarget).
PENDING = {Path("dohnuts/bench/measure/workload.py")}


def test_optional_members_are_read_only_by_the_contracts():
    """No `getattr(obj, "<optional member>", ...)` outside dohnuts/bench/contracts.py."""
    members = {f for caps in CONTRACTS.values() if caps for f in caps.__dataclass_fields__}
    found = []
    for folder in ("dohnuts/bench", "bench_plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == Path("dohnuts/bench/contracts.py") or rel in PENDING:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                        and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                        and node.args[1].value in members):
                    found.append(f"{rel}:{node.lineno} ({node.args[1].value})")
    assert not found
