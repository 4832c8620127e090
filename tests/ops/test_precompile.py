"""The table's recorded kernels compiled on threads (dohnuts/ops/_precompile.py), on the CPU.

Triton compiles for the H200 (sm_90) here without a GPU (tests/ops/triton_offline.py): inside
`offline_launches` a launch compiles its kernel and runs nothing. That is enough to prove what the
mechanism must get right: a specialisation recorded at a launch, preloaded on threads into a
process that has never compiled it, is the very kernel a later launch looks up — that launch
compiles nothing. A compile counter (Triton's `jit_cache_hook`, called before every compile) says
so; the same launches without the preload compile every kernel (the counter's control).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as the H200's Triton 3.6 compiles (test_kernels_compile)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

from dohnuts.ops import _precompile  # noqa: E402
from tests.ops.test_kernels_compile import _fla_inference, fla_entry_points  # noqa: E402,F401 (a fixture)
from tests.ops.triton_offline import offline_launches  # noqa: E402


_COMMAND_CACHE = knobs.cache.dir  # the test command's Triton cache (TRITON_CACHE_DIR, or Triton's default)


@triton.jit
def _scale(x, y, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * factor, mask=offs < n)


@triton.heuristics({"EVEN": lambda args: args["n"] % 64 == 0})
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
@triton.jit
def _exp_tuned(x, y, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs) if EVEN else tl.load(x + offs, mask=offs < n)
    tl.store(y + offs, tl.exp(v.to(tl.float32)).to(y.dtype.element_ty), mask=offs < n)


def _launch_all():
    """Three specialisations: two of `_scale` (BF16 / FP32, different blocks), one of the wrapped
    `_exp_tuned` (heuristics over an autotuner: the offline driver runs its first config)."""
    for dtype, block in ((torch.bfloat16, 128), (torch.float32, 256)):
        x = torch.empty(1000, dtype=dtype)
        _scale[(4,)](x, torch.empty_like(x), 1000, 0.5, BLOCK=block)
    x = torch.empty(4096, dtype=torch.bfloat16)
    _exp_tuned[(64,)](x, torch.empty_like(x), 4096)


def _forget():
    for fn in (_scale, _exp_tuned.fn.fn):
        fn.device_caches.clear()  # this process's compiled kernels (the disk cache is the fixture's)
    _precompile._STARTED.clear()


@pytest.fixture
def compiles(tmp_path, monkeypatch):
    """A fresh Triton disk cache, no compiled kernel in memory, and the names of the kernels
    compiled from now on (by launch or preload)."""
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "cache"))
    _forget()
    seen: list[str] = []
    before = knobs.runtime.jit_cache_hook

    def count(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        seen.append(fn.name)
        return False

    knobs.runtime.jit_cache_hook = count
    yield seen
    knobs.runtime.jit_cache_hook = before
    _forget()


def _recorded() -> dict:
    with offline_launches("sm_90"), _precompile.record() as made:
        _launch_all()
    return made


def test_a_recorded_kernel_preloaded_on_threads_is_the_one_a_launch_looks_up(compiles, monkeypatch, tmp_path):
    table = _recorded()
    assert sorted(e["name"] for e in table["compiled"]) == ["_exp_tuned", "_scale", "_scale"]
    assert len(compiles) == 3
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "second"))  # the preload compiles: nothing on disk
    _forget()
    compiles.clear()
    with offline_launches("sm_90"):
        started = _precompile.precompile(torch.device("cpu"), table=table, threads=2)
        done = started.wait()
        assert done["kernels"] == 3 and done["failed"] == 0 and done["threads"] == 2, done
        assert sorted(compiles) == ["_exp_tuned", "_scale", "_scale"]  # compiled by the preload
        assert _precompile.precompile(torch.device("cpu"), table=table) is started  # once a process
        compiles.clear()
        _launch_all()
    assert compiles == []  # every launch found its kernel


def test_without_the_preload_every_launch_compiles(compiles):
    table = _recorded()
    _forget()
    compiles.clear()
    with offline_launches("sm_90"):
        assert _precompile.precompile(torch.device("cpu"), table={"compiled": []}) is None
        _launch_all()
    assert len(compiles) == len(table["compiled"]) == 3


def test_a_table_recorded_where_triton_lives_elsewhere_is_rewritten_to_this_libdevice(compiles):
    table = _recorded()
    here = table["libdevice"]
    assert here and here.endswith(".bc")
    elsewhere = "/opt/other-site/triton/backends/nvidia/lib/libdevice.10.bc"
    moved = {"libdevice": elsewhere,
             "compiled": [dict(e, data=e["data"].replace(here, elsewhere)) for e in table["compiled"]]}
    assert all(elsewhere in e["data"] for e in moved["compiled"])  # the path is in each recorded key

    for recorded, compiled_again in ((moved, 0), ({"compiled": moved["compiled"]}, 3)):  # rewritten; not
        _forget()
        compiles.clear()
        with offline_launches("sm_90"):
            _precompile.precompile(torch.device("cpu"), table=recorded, threads=2).wait()
            compiles.clear()
            _launch_all()
        assert len(compiles) == compiled_again


def test_a_kernel_the_table_names_that_no_longer_exists_is_skipped_and_said(compiles, capsys):
    table = _recorded()
    gone = dict(table["compiled"][0], name="_no_such_kernel")
    _forget()
    with offline_launches("sm_90"):
        started = _precompile.precompile(torch.device("cpu"), table={"compiled": [gone, *table["compiled"][1:]]},
                                         threads=2)
        assert started.wait()["kernels"] == 2
    assert "1 recorded kernel(s) not found" in capsys.readouterr().err


def test_a_cpu_session_precompiles_nothing():
    assert _precompile.precompile(torch.device("cpu")) is None


@pytest.mark.slow
def test_fla_s_kernels_along_dohnuts_calls_preload_to_the_keys_their_launches_look_up(compiles, monkeypatch,
                                                                                       fla_entry_points):
    """fla's kernels have long argument lists, heuristics outermost, autotuners and integer
    specialisation: the recorded key must still be the launch's. The disk cache is the test
    command's own (test_kernels_compile fills it with these kernels): what this checks is the key a
    preload leaves in memory, not compiling, which the small kernels' tests above do for real."""
    monkeypatch.setattr(knobs.cache, "dir", _COMMAND_CACHE)
    with offline_launches("sm_90"), _precompile.record() as table:
        _fla_inference(fla_entry_points, torch)
    kernels = {(e["module"], e["name"]) for e in table["compiled"]}
    assert len(table["compiled"]) >= 6 and any(m.startswith("fla.ops") for m, _ in kernels)

    def forget_fla():
        for module, name in kernels:
            _precompile.jit_function(module, name).device_caches.clear()
        _precompile._STARTED.clear()

    forget_fla()
    compiles.clear()
    with offline_launches("sm_90"):
        done = _precompile.precompile(torch.device("cpu"), table=table, threads=2).wait()
        assert done["failed"] == 0, done
        compiles.clear()
        _fla_inference(fla_entry_points, torch)
    forget_fla()
    assert compiles == []


def test_the_recording_script_leaves_out_a_peer_s_launches():
    """benchmarks/maintainers/compiled_kernels.py keeps what dohnuts launches: a compile under a
    frame of transformers (its Qwen3.5 calls fla) is the peer's."""
    from benchmarks.maintainers.compiled_kernels import launched_by_dohnuts

    scope: dict = {"check": launched_by_dohnuts}
    exec(compile("def forward():\n    return check()\n", "/site-packages/transformers/models/qwen3_5/m.py", "exec"),
         scope)
    assert launched_by_dohnuts() is True
    assert scope["forward"]() is False


@pytest.fixture
def held_compiles(monkeypatch):
    """`precompile` answering with 5 kernels on 4 threads still compiling until `gate.set()`."""
    import threading
    from concurrent.futures import Future

    gate = threading.Event()
    future: Future = Future()
    threading.Thread(target=lambda: (gate.wait(600), future.set_result(None)), daemon=True).start()
    started = _precompile.Precompiled(kernels=5, threads=4, started=0.0, futures=[future])
    monkeypatch.setattr(_precompile, "precompile", lambda device: started)
    return gate, future


def _bench_targets(n: int) -> list:
    """Bench dohnuts targets with only what `_kernels_compiled` reads (no model built)."""
    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget

    targets = [object.__new__(DohnutsTarget) for _ in range(n)]
    for t in targets:
        t._first_extra = {}
    return targets


def _waits_until_released(target, gate) -> None:
    import threading

    waited = threading.Thread(target=target._kernels_compiled, args=(torch.device("cuda"),))
    waited.start()
    waited.join(0.2)
    assert waited.is_alive()  # still compiling: the target is not built yet
    gate.set()
    waited.join(600)
    assert not waited.is_alive()


def test_the_bench_s_dohnuts_target_waits_for_the_compiles_and_its_first_call_says_so(held_compiles):
    """The first dohnuts target of a run waits before any call (no call shares the CPU with a
    compile); its first-call record carries what compiled, once; a later target waits for nothing."""
    gate, _ = held_compiles
    first, second = _bench_targets(2)
    _waits_until_released(first, gate)
    extra = first._take_first_extra()["kernels_precompiled"]
    assert extra["kernels"] == 5 and extra["threads"] == 4 and extra["failed"] == 0
    assert first._take_first_extra() == {}  # the first call only
    second._kernels_compiled(torch.device("cuda"))
    assert second._take_first_extra() == {}  # compiled already: nothing to wait for or to say


def test_the_reference_check_s_build_does_not_wait_for_the_compiles(held_compiles):
    """The FP32 reference check builds a dohnuts target inside `reference()` (plain-torch ops, no
    call measured): it goes on while the kernels compile, and the measured target after it still
    waits and says so."""
    import threading

    from dohnuts.ops._dispatch import reference

    gate, future = held_compiles
    ref, measured = _bench_targets(2)

    def build_reference():
        with reference():
            ref._kernels_compiled(torch.device("cuda"))

    built = threading.Thread(target=build_reference, daemon=True)
    built.start()
    built.join(60)  # at once, really: the gate is still shut (a hang guard, not a timing)
    assert not built.is_alive() and not future.done() and ref._take_first_extra() == {}
    _waits_until_released(measured, gate)
    assert measured._take_first_extra()["kernels_precompiled"]["kernels"] == 5


def test_a_table_that_cannot_be_read_leaves_the_kernels_to_their_launches_and_says_so(compiles, capsys):
    """Compiling ahead is a head start only: whatever goes wrong (here, a table entry without its
    specialisation) is one line on stderr, and `dohnuts.load` goes on."""
    with offline_launches("sm_90"):
        assert _precompile.precompile(torch.device("cpu"), table={"compiled": [{"module": __name__}]}) is None
    assert "not compiled ahead (KeyError" in capsys.readouterr().err


def test_the_first_calls_script_counts_what_ran_where():
    """benchmarks/maintainers/first_calls.py's summary: preloads apart from launch compiles, launcher
    builds by thread, and only the autotunes that benchmarked (a cache lookup takes a millisecond)."""
    from benchmarks.maintainers.first_calls import summary

    def e(what, thread, kernel, seconds=0.0, key=""):
        return {"t": 1.0, "thread": thread, "what": what, "kernel": kernel, "seconds": seconds, "key": key}

    got = summary([e("compile", "dohnuts-compile_0", "m.k"), e("compile", "dohnuts-compile_3", "m.j"),
                   e("compile", "MainThread", "m.k"), e("compile", "Dummy-1", "m.k"), e("compile", "MainThread", "m.p"),
                   e("launcher build", "dohnuts-compile_1", "__triton_launcher", 0.4),
                   e("launcher build", "MainThread", "__triton_launcher", 0.3),
                   e("launcher build", "Dummy-1", "__triton_launcher", 0.2),
                   e("module build", "MainThread", "cuda_utils", 0.5),
                   e("autotune", "MainThread", "_conv_kernel", 2.15, "(6144, 128)"),
                   e("autotune", "MainThread", "_delta_h_kernel", 0.001, "(16, 16)")])
    assert got["preloads"] == 2
    assert got["launch_compiles"] == {"m.k": 2, "m.p": 1}
    assert got["launcher_builds"] == {"compile threads": 1, "other threads": 2, "other threads' seconds": 0.5}
    assert got["autotunes_benchmarked"] == [{"kernel": "_conv_kernel", "seconds": 2.15, "key": "(6144, 128)",
                                             "at_s": 1.0}]


def test_the_h200_tables_unfilter_entry_is_what_a_448_row_launch_looks_up(compiles):
    """The table's entry for the PNG unfilter kernel (edited by hand when the kernel's warps changed,
    M46) is the specialisation a 448-row image's launch records here: its signature, constants,
    argument attributes and launch options (warps, stages). Its source digest is the kernel's own
    (tests/ops/test_tuned.py). Triton's version-dependent options (this machine's against the
    H200's) are not compared."""
    import json

    from dohnuts.ops._tuned import TABLES
    from dohnuts.ops._unfilter_kernel import unfilter_triton

    (entry,) = [e for e in json.loads((TABLES / "h200.json").read_text())["compiled"] if e["name"] == "_unfilter_kernel"]
    with offline_launches("sm_90"), _precompile.record() as made:
        unfilter_triton(torch.zeros((448, 1 + 3 * 448), dtype=torch.uint8), 448, 448)
    (launched,) = [e for e in made["compiled"] if e["name"] == "_unfilter_kernel"]

    def spec(data: str) -> dict:
        d = json.loads(data)
        attrs = {str(k): v for k, v in zip(d["attrs_keys"], d["attrs_vals"], strict=True) if v}  # (newer Triton
        # lists the constexpr argument with no attribute too)
        return {k: d[k] for k in ("name", "signature", "constant_keys", "constant_vals")} | {"attrs": attrs} | {
            k: d["options"][k] for k in ("num_warps", "num_ctas", "num_stages")}

    assert spec(entry["data"]) == spec(launched["data"])


def test_the_h200_tables_varlen_kkt_entry_is_what_a_shared_pass_launch_looks_up(compiles, monkeypatch,
                                                                                 fla_entry_points):
    """The table's entries for a shared pass's one-launch kernels over its rows (varlen: the prefix's
    and the suffixes' chunks together, `SharedDeltaRule`), each added by hand with its op — fla's
    kkt_solve kernel (M47) and dohnuts' gates (`_gdn_gates_varlen_kernel`, M52) — are the
    specialisations the op's launches record here at 2b's sizes (a bf16 model: A_log and dt_bias
    bf16), as for the unfilter kernel above."""
    import json

    from dohnuts.ops import delta_rule
    from dohnuts.ops._tuned import TABLES

    monkeypatch.setattr(delta_rule, "_multiprocessors", lambda device: 132)  # the H200's (no GPU here)
    varlen = [e for e in json.loads((TABLES / "h200.json").read_text())["compiled"]
              if e["name"] == "chunk_gated_delta_rule_fwd_kkt_solve_kernel"
              and json.loads(e["data"])["constant_vals"][-1] is True]
    assert len(varlen) == 1, len(varlen)
    P, B, L, H, K = 448, 32, 64, 16, 128
    q, k, v = (torch.empty(P + B * L, H, K, dtype=torch.bfloat16) for _ in range(3))
    ab = torch.empty(P + B * L, 2 * H, dtype=torch.bfloat16)
    with offline_launches("sm_90"), _precompile.record() as made:
        delta_rule.SharedDeltaRule.apply(q, k, v, ab[:, :H], ab[:, H:], torch.zeros(H, dtype=torch.bfloat16),
                                         torch.zeros(H, dtype=torch.bfloat16),
                                         delta_rule.shared_chunk_index(P, B, L, "cpu"), P, L, K ** -0.5)
    (launched,) = [e for e in made["compiled"] if e["name"] == "chunk_gated_delta_rule_fwd_kkt_solve_kernel"]
    (gates,) = [e for e in json.loads((TABLES / "h200.json").read_text())["compiled"]
                if e["name"] == "_gdn_gates_varlen_kernel"]
    (launched_gates,) = [e for e in made["compiled"] if e["name"] == "_gdn_gates_varlen_kernel"]

    def spec(data: str) -> dict:
        d = json.loads(data)
        attrs = {str(k): v for k, v in zip(d["attrs_keys"], d["attrs_vals"], strict=True) if v}
        return {k: d[k] for k in ("name", "signature", "constant_keys", "constant_vals")} | {"attrs": attrs} | {
            k: d["options"][k] for k in ("num_warps", "num_ctas", "num_stages")}

    assert spec(varlen[0]["data"]) == spec(launched["data"])
    assert spec(gates["data"]) == spec(launched_gates["data"])
