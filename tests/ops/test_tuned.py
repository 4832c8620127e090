"""The tuned-configuration table (dohnuts.ops._tuned): seeding writes exactly where Triton's
autotuner reads, only on the machine the table was made for, and every committed entry belongs
to a kernel source that still exists unchanged."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

from dohnuts.ops import _tuned


def _table(tmp_path, fingerprint: str) -> list[dict]:
    key = "ab" * 32  # a sha256 hex digest, as the autotuner's
    content = json.dumps({"key": [128, "torch.bfloat16"], "configs_timings": [[{"kwargs": {"BV": 64}}, [0.1]]]})
    return [{"fingerprint": fingerprint, "entries": [
        {"key": key, "file": "k.autotune.json", "module": "m", "kernel": "k", "source_sha256": "0", "content": content}]}]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    import triton

    d = tmp_path / "cache"
    monkeypatch.setattr(triton.knobs.cache, "dir", str(d))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "Test GPU")
    _tuned.seed.cache_clear()
    yield d
    _tuned.seed.cache_clear()


def test_seed_writes_where_the_autotuner_reads(cache_dir, monkeypatch, tmp_path):
    from triton.runtime.cache import get_cache_manager

    tables = _table(tmp_path, "mine")
    monkeypatch.setattr(_tuned, "fingerprint", lambda: "mine")
    monkeypatch.setattr(_tuned, "load_tables", lambda: tables)
    assert _tuned.seed() == 1
    entry = tables[0]["entries"][0]
    path = get_cache_manager(entry["key"]).get_file(entry["file"])  # the autotuner's own lookup
    assert path is not None and open(path).read() == entry["content"]
    assert _tuned.seed() == 1  # once a process (cached)
    _tuned.seed.cache_clear()
    assert _tuned.seed() == 0  # a present entry is never overwritten


def test_another_machine_tunes_and_says_so_once(cache_dir, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_tuned, "fingerprint", lambda: "other")
    monkeypatch.setattr(_tuned, "load_tables", lambda: _table(tmp_path, "mine"))
    assert _tuned.seed() == 0 and _tuned.seed() == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tuned-kernel table" in err[0] and "Test GPU" in err[0]
    assert not cache_dir.exists() or not any(cache_dir.rglob("*.json"))


def test_the_table_builder_recovers_the_autotuner_s_key():
    import base64

    from benchmarks.maintainers.tuned_table import _hex_key

    key = "0123456789abcdef" * 4
    directory = base64.b32encode(bytes.fromhex(key)).decode().rstrip("=")  # triton.runtime.cache._base32
    assert _hex_key(directory) == key


# The kernels as a new process imports them (fla's among them: this process keeps fla out,
# tests/conftest.py), read once for both tests below: which committed entries no longer match their
# kernel's source, and which of fla's and dohnuts' kernels the table builder does not find.
FLA_AND_OWN_KERNELS = ("chunk_fwd_kernel_o", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
                       "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64", "prepare_wy_repr_bwd_kernel",
                       "_delta_h_kernel", "_conv_kernel")
_KERNEL_FACTS = f"""
import importlib, json
from benchmarks.maintainers.tuned_table import kernels
from dohnuts.ops import _tuned
stale = sorted({{f"{{e['module']}}.{{e['kernel']}}" for t in _tuned.load_tables() for e in t["entries"]
                if _tuned.source_digest(getattr(importlib.import_module(e["module"]), e["kernel"]))
                != e["source_sha256"]}})
from dohnuts.ops._precompile import jit_function
stale += sorted({{f"compiled {{e['module']}}.{{e['name']}}" for t in _tuned.load_tables() for e in t.get("compiled", [])
                 if _tuned.source_digest(jit_function(e["module"], e["name"])) != e["source_sha256"]}})
found = kernels()
print(json.dumps({{"stale": stale, "not_found": [n for n in {FLA_AND_OWN_KERNELS!r} if n not in found]}}))
"""


def _read_kernel_facts(folder) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _KERNEL_FACTS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder / "facts.json").write_text(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kernel_facts(made_once) -> dict:
    """_KERNEL_FACTS' answer, from one new process for the test command (tests/conftest.py's made_once)."""
    return json.loads((made_once("tuned-kernel-facts", _read_kernel_facts) / "facts.json").read_text())


def test_committed_entries_match_today_s_kernel_sources(kernel_facts):
    """A kernel edited, or moved to another line, after its table was made has a stale entry (never
    read: its cache directory hashes the old source and line, so that kernel tunes on first use
    again; a stale recorded kernel, dohnuts.ops._precompile, compiles a key no launch looks up). Remake the table on the GPU
    (benchmarks/maintainers/tuned_table.py) in the session that changed the kernel. In a new process
    (kernel_facts): fla's kernels are among the entries, and this one keeps fla out (tests/conftest.py)."""
    tables = _tuned.load_tables()
    if not tables:
        pytest.skip("no tuned table committed")
    for table in tables:
        assert table["entries"], "a table without entries"
        for entry in table["entries"]:
            json.loads(entry["content"])["configs_timings"]
    stale = kernel_facts["stale"]
    assert not stale, f"stale tuned entries (kernel source or line changed): {stale}"


def test_the_table_builder_finds_autotuners_under_other_wrappers(kernel_facts):
    """fla puts `@triton.heuristics` outside `@triton.autotune` on most of its kernels: the builder
    finds those autotuners too (a table without them leaves most of fla's kernels to tune).
    In a new process (kernel_facts): this one keeps fla out (tests/conftest.py)."""
    assert kernel_facts["not_found"] == []


def test_a_kernel_moved_down_its_file_no_longer_matches_its_entry(tmp_path):
    """Triton keys a kernel's autotune cache by its source and the line it starts on: the digest a
    table entry is checked by changes with either, and with nothing else (M44: a docstring one
    line longer above `_conv_kernel` made a fresh H200 autotune it again)."""
    import importlib.util

    kernel = "@triton.jit\ndef k(X, N: tl.constexpr):\n    tl.store(X + tl.arange(0, N), 0.0)\n"
    head = "import triton\nimport triton.language as tl\n"

    def digest(name: str, text: str) -> str:
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"moved_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return _tuned.source_digest(module.k)

    here = digest("a", head + "\n" + kernel)
    assert digest("b", head + "\n" + kernel) == here  # the same source on the same line: another file
    assert digest("c", head + "\n\n" + kernel) != here  # one line further down
    assert digest("d", head + "\n" + kernel.replace("0.0", "1.0")) != here  # edited
