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
