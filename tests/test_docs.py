"""Documentation stays true: every hook is documented; README's test command is .ci/run's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from dohnuts.bench import hookspecs

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    return [name for name, fn in vars(hookspecs).items()
            if name.startswith("dohnuts_bench_") and inspect.isfunction(fn)]


def test_every_hook_has_a_docstring_and_a_row_in_the_plugin_guide():
    guide = (ROOT / "docs" / "plugins.md").read_text()
    hooks = _hooks()
    assert len(hooks) >= 8
    for name in hooks:
        assert (getattr(hookspecs, name).__doc__ or "").strip(), f"{name} has no docstring"
        assert f"`{name}(" in guide, f"{name} is missing from docs/plugins.md"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")).strip()
    assert command in readme
    assert re.search(r"pip install .*-e '\.\[test\]'", command)


# -- the plugin contracts and docs/plugins.md ---------------------------------------------------------

FENCE = re.compile(r"```.*?```", re.S)
SPAN = re.compile(r"`([^`\n]+)`")
CLASS_NAME = re.compile(r"(?<![.\w])([A-Z][a-z][A-Za-z0-9]*)")
DOTTED = re.compile(r"\b(dohnuts(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _contracts():
    from dohnuts.bench import contracts

    return contracts


def _params(fn) -> str:
    """`a, b, *, c` of a protocol method (self left out)."""
    out, star = [], False
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(p.name)
    return ", ".join(out)


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every `###` section."""
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2) if parts[i].startswith("### ")]


def _member_rows(body: str) -> list[tuple[str, str | None, str]]:
    """(member, its parameters or None, required/optional) of each row of a section's member tables."""
    rows = []
    for line in body.splitlines():
        m = re.match(r"\|\s*`([A-Za-z_]\w*)(?:\(([^)]*)\))?`\s*\|\s*(required|optional)", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def test_the_plugin_guide_documents_every_member_of_every_contract():
    """Each contract of dohnuts.bench.contracts has a section of docs/plugins.md whose member tables
    list exactly its required members (methods with their parameters) and its optional members."""
    import dataclasses

    contracts = _contracts()
    guide = (ROOT / "docs" / "plugins.md").read_text()
    seen = set()
    for heading, body in _sections(guide):
        named = [contracts.__dict__[n] for n in SPAN.findall(heading) if n in contracts.__dict__
                 and contracts.__dict__[n] in contracts.CONTRACTS]
        if not named:
            continue
        seen.update(named)
        required = {m: proto for proto in named for m in contracts.protocol_members(proto)}
        optional = {f.name for proto in named if contracts.CONTRACTS[proto]
                    for f in dataclasses.fields(contracts.CONTRACTS[proto])}
        rows = _member_rows(body)
        assert {m for m, _, how in rows if how == "required"} == set(required), heading
        assert {m for m, _, how in rows if how == "optional"} == optional, heading
        for member, params, how in rows:
            fn = required.get(member) and required[member].__dict__.get(member)
            if how == "required" and callable(fn):
                assert params == _params(fn), f"{heading}: `{member}({params})` but the contract has ({_params(fn)})"
    assert seen == set(contracts.CONTRACTS), f"no section for {set(contracts.CONTRACTS) - seen}"


def _known_names() -> dict:
    import builtins
    import importlib

    names = dict(vars(builtins))
    for module in ("dohnuts.bench.contracts", "dohnuts.bench.calls", "dohnuts.bench.report", "dohnuts.bench.sink",
                   "dohnuts.bench.telemetry", "dohnuts.bench.workload", "dohnuts.bench.plugins", "dohnuts.errors",
                   "dohnuts.runtime.timing", "dohnuts.runtime.predict", "dohnuts.runtime.work"):
        names.update(vars(importlib.import_module(module)))
    contracts = _contracts()
    for proto, caps in contracts.CONTRACTS.items():  # a member may be named alone (`Options`)
        names.update(dict.fromkeys(contracts.protocol_members(proto)))
        names.update(dict.fromkeys(f.name for f in (__import__("dataclasses").fields(caps) if caps else ())))
    return names


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _undefined_names(text: str) -> list[str]:
    """The classes and dotted paths a text names in backticks (code blocks left out) that do not exist."""
    known = _known_names()
    bad = []
    for span in SPAN.findall(FENCE.sub("", text)):
        for dotted in DOTTED.findall(span):
            if not _resolves(dotted):
                bad.append(dotted)
        for name in CLASS_NAME.findall(DOTTED.sub("", span)):
            if name not in known:
                bad.append(name)
    return bad


def test_the_plugin_guide_and_the_hookspecs_name_only_what_exists():
    """Every class and dotted path docs/plugins.md and the hook docstrings name exists (the guide
    once named a `WorkloadKind` and a `dohnuts.bench.target.Target` that did not)."""
    assert not _undefined_names((ROOT / "docs" / "plugins.md").read_text())
    for name in _hooks():
        assert not _undefined_names(getattr(hookspecs, name).__doc__), name
    assert not _undefined_names(hookspecs.__doc__)


def test_the_name_check_can_fail():
    assert _undefined_names("a `WorkloadKindz` and `dohnuts.bench.target.Target`, not `WorkloadKind`") == [
        "WorkloadKindz", "dohnuts.bench.target.Target"]


def test_the_documented_factory_arity_is_the_contracts():
    """The target factory is documented, in the guide and in its hook, with the parameters the
    contract and the runner use: (spec, device, dtype, options)."""
    contracts = _contracts()
    params = _params(contracts.TargetFactory.__call__)
    assert params == "spec, device, dtype, options"
    assert f"factory({params})" in (ROOT / "docs" / "plugins.md").read_text()
    assert f"factory({params})" in hookspecs.dohnuts_bench_register_targets.__doc__
