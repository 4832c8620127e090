"""dohnuts imports only the fla modules it calls (dohnuts/ops/_fla.py, `defer_package_inits`).

fla's `fla.ops` and `fla.modules` packages import every op and module fla has in their __init__;
dohnuts leaves those two __init__s deferred until something asks the package itself for a name.
These tests check that nothing changes for anyone: the entry points are the real ones, and a later
`from fla.modules import X` / `import fla.ops` (transformers' Qwen3.5 peer, a user) gets the
complete package, in the same module object.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from dohnuts.ops._fla import _DeferredPackage, defer_package_inits

pytest.importorskip("triton")  # fla imports Triton at import time

# --- the mechanism, on a package of our own (fast, in this process) ---------------------------------


@pytest.fixture
def umbrella(tmp_path, monkeypatch):
    """A package `umb` whose subpackage `umb.ops` imports a heavy op `umb.ops.big` in its __init__
    and re-exports it; `umb.ops.small` is what a caller wants. Each module records its import."""
    root = tmp_path / "umb"
    (root / "ops").mkdir(parents=True)
    (root / "__init__.py").write_text("LOG = []\n")
    (root / "ops" / "__init__.py").write_text(
        "import umb\numb.LOG.append('ops')\nfrom .big import heavy\n__all__ = ['heavy']\n")
    (root / "ops" / "big.py").write_text("import umb\numb.LOG.append('big')\ndef heavy():\n    return 'heavy'\n")
    (root / "ops" / "small.py").write_text("import umb\numb.LOG.append('small')\ndef light():\n    return 'light'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [n for n in sys.modules if n == "umb" or n.startswith("umb.")]:
        del sys.modules[name]


def test_a_submodule_imports_without_its_package_init_which_runs_on_the_first_name_asked(umbrella):
    defer_package_inits("umb", ("umb.ops",))
    import umb
    from umb.ops.small import light

    assert light() == "light"
    assert umb.LOG == ["small"]  # neither the package's __init__ nor the op it imports ran
    ops = sys.modules["umb.ops"]
    assert type(ops) is _DeferredPackage and umb.ops is ops

    from umb.ops import heavy  # a name the package's own __init__ defines: it runs now, in place

    assert heavy() == "heavy" and umb.LOG == ["small", "ops", "big"]
    assert sys.modules["umb.ops"] is ops and type(ops) is types.ModuleType
    assert ops.__all__ == ["heavy"] and ops.small.light is light
    with pytest.raises(AttributeError):
        ops.missing  # an ordinary module now: a missing name is an AttributeError, and no second run
    assert umb.LOG == ["small", "ops", "big"]


def test_a_package_init_that_fails_raises_and_stays_deferred_for_the_next_use(umbrella):
    (umbrella / "ops" / "__init__.py").write_text(
        "import umb\numb.LOG.append('ops')\nif umb.LOG.count('ops') == 1:\n    raise ImportError('first time')\n"
        "X = 1\n")
    defer_package_inits("umb", ("umb.ops",))
    import umb.ops.small  # noqa: F401

    ops = sys.modules["umb.ops"]
    with pytest.raises(ImportError, match="first time"):
        ops.X
    assert type(ops) is _DeferredPackage
    assert ops.X == 1 and type(ops) is types.ModuleType


def test_listing_a_deferred_package_completes_it(umbrella):
    defer_package_inits("umb", ("umb.ops",))
    import umb.ops.small  # noqa: F401

    assert "heavy" in dir(sys.modules["umb.ops"]) and type(sys.modules["umb.ops"]) is types.ModuleType


def test_a_package_already_imported_is_left_as_it_is(umbrella):
    """(fla imported whole by a user or another library before dohnuts: used as it is)"""
    import umb.ops

    before = sys.modules["umb.ops"]
    defer_package_inits("umb", ("umb.ops",))
    assert sys.modules["umb.ops"] is before and type(before) is types.ModuleType


# --- fla itself, in a fresh process (the test processes hide fla: tests/conftest.py) --------------

PROBE = r"""
import json, sys, types
from dohnuts.ops._fla import fla
ns = fla()
loaded = sorted(m for m in sys.modules if m.startswith("fla."))
kinds = {n: type(sys.modules[n]).__name__ for n in ("fla.ops", "fla.modules")}
# what transformers' Qwen3.5 and a user do after dohnuts: each must see the whole package
import fla.ops
import fla.ops.gated_delta_rule as gdr
from fla.modules import FusedRMSNormGated, ShortConvolution
from fla.modules.fused_norm_gate import rms_norm_gated  # one of fla.modules' aliases, made by its __init__
same_delta_rule = gdr.chunk_gated_delta_rule is ns.chunk_gated_delta_rule is fla.ops.chunk_gated_delta_rule
ops_all = "chunk_gla" in fla.ops.__all__ and callable(fla.ops.chunk_gla)
print(json.dumps({
    "loaded": loaded, "kinds": kinds,
    "after": {n: type(sys.modules[n]).__name__ for n in ("fla.ops", "fla.modules")},
    "same_delta_rule": same_delta_rule, "same_gated_norm": rms_norm_gated is ns.rms_norm_gated, "ops_all": ops_all,
    "classes": [FusedRMSNormGated.__name__, ShortConvolution.__name__],
    "names": sorted(vars(ns)),
}))
"""


def _probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dohnuts_imports_the_fla_modules_it_calls_and_a_later_import_gets_the_whole_package():
    seen = _probe()
    # the ops dohnuts never calls were not imported; the ones it calls were
    assert not [m for m in seen["loaded"] if m.split(".")[:3] in (["fla", "ops", "rwkv7"], ["fla", "ops", "abc"],
                                                                  ["fla", "ops", "gla"], ["fla", "modules", "grpo"])]
    assert {"fla.ops.gated_delta_rule.chunk", "fla.ops.common.chunk_o", "fla.modules.norm.fused_norm_gate",
            "fla.modules.causal_conv1d"} <= set(seen["loaded"])
    assert seen["kinds"] == {"fla.ops": "_DeferredPackage", "fla.modules": "_DeferredPackage"}
    assert seen["after"] == {"fla.ops": "module", "fla.modules": "module"}
    assert seen["same_delta_rule"] and seen["same_gated_norm"] and seen["ops_all"]
    assert seen["classes"] == ["FusedRMSNormGated", "ShortConvolution"]
    assert "chunk_gated_delta_rule" in seen["names"] and "rms_norm_gated" in seen["names"]
    # fla's SwiGLU module (torch.compile'd helpers) waits for the unpacked path that calls it
    assert "swiglu" not in seen["names"] and not [m for m in seen["loaded"] if m.startswith("fla.modules.activations")]
