"""CPU measurement: fla's inference kernels along dohnuts' calls compiled for sm_90, (a) at their
launches, one after another (as a fresh process does today), (b) preloaded on THREADS threads
(default 2), (c) the launches after (b). Fresh Triton disk caches each time. `precompile_cpu.py
REPS THREADS`; a preload that raises is counted in `failed` and the first one printed."""
import os, sys, tempfile, time
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
sys.modules.pop("fla", None)
import torch
from triton import knobs
from dohnuts.ops import _precompile
from dohnuts.ops._fla import fla
from tests.ops.test_kernels_compile import _fla_inference
from tests.ops.triton_offline import offline_launches
f = fla()
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    knobs.cache.dir = tempfile.mkdtemp()
    t = time.perf_counter()
    with offline_launches("sm_90"), _precompile.record() as table:
        _fla_inference(f, torch)
    serial = time.perf_counter() - t
    kernels = {(e["module"], e["name"]) for e in table["compiled"]}
    for m, n in kernels: _precompile.jit_function(m, n).device_caches.clear()
    _precompile._STARTED.clear()
    knobs.cache.dir = tempfile.mkdtemp()
    with offline_launches("sm_90"):
        t = time.perf_counter()
        s = _precompile.precompile(torch.device("cpu"), table=table, threads=threads).wait()
        pre = time.perf_counter() - t
        t = time.perf_counter(); _fla_inference(f, torch); after = time.perf_counter() - t
    for m, n in kernels: _precompile.jit_function(m, n).device_caches.clear()
    _precompile._STARTED.clear()
    print(f"{len(table['compiled'])} kernels: at launch {serial:.2f} s; preloaded on {threads} threads {pre:.2f} s ({s}); launches after {after:.2f} s")
