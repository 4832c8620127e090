"""A/B of dohnuts' fla import: 'old' = fla.ops and fla.modules imported whole (what the previous
_fla.py's imports did), 'new' = dohnuts.ops._fla.fla() as it is now. One fresh process per sample."""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the checkout
mode = sys.argv[1]
import torch, triton  # both before the clock: not fla's cost
t, c = time.perf_counter(), time.process_time()
if mode == "old":
    import fla.ops, fla.modules  # noqa
from dohnuts.ops._fla import fla
fla()
print(f"{mode} wall {time.perf_counter()-t:.2f} cpu {time.process_time()-c:.2f} fla_modules {sum(1 for m in sys.modules if m.startswith('fla'))} all_modules {len(sys.modules)}")
