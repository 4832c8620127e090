"""Scratch (session 46, from session 45): after a capture fails (a device synchronise inside it), does a later
capture into the SAME pool fail, and into a FRESH pool succeed? Both capture modes."""
import sys

import torch

from dohnuts.runtime.graphs import capturing


def attempt(pool, fail, mode, helper=False):
    g = torch.cuda.CUDAGraph()
    before = torch.cuda.current_stream()
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(2):
        x * 2
    torch.cuda.synchronize()
    ctx = capturing(g, pool) if helper else torch.cuda.graph(g, pool=pool, capture_error_mode=mode)
    try:
        with ctx:
            y = x * 2
            z = torch.empty(1 << 22, device="cuda")  # an allocation in the pool
            z.fill_(1)
            if fail:
                torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        return f"captured, sum {float(y.sum()):.0f}"
    except Exception as e:  # noqa: BLE001
        same = torch.cuda.current_stream() == before
        torch.cuda.set_stream(before)
        return f"failed ({'stream kept' if same else 'STREAM LEFT CHANGED'}): {type(e).__name__}: {str(e).splitlines()[0][:140]}"


out = []
for mode in ("global", "thread_local"):
    pool = torch.cuda.graph_pool_handle()
    out.append(f"[{mode}] 1 a failing capture into pool P: {attempt(pool, True, mode)}")
    out.append(f"[{mode}] 2 a good capture into P:          {attempt(pool, False, mode)}")
    out.append(f"[{mode}] 3 a good capture into a fresh pool: {attempt(torch.cuda.graph_pool_handle(), False, mode)}")
    out.append(f"[{mode}] 4 a good capture into P again:    {attempt(pool, False, mode)}")
    out.append(f"[{mode}] 5 a good capture, default pool:   {attempt(None, False, mode)}")
pool = torch.cuda.graph_pool_handle()
out.append(f"[capturing] 1 a failing capture into pool Q: {attempt(pool, True, 'thread_local', helper=True)}")
out.append(f"[capturing] 2 a good capture into a fresh pool: {attempt(torch.cuda.graph_pool_handle(), False, 'thread_local', helper=True)}")
text = "\n".join(out)
print(text)
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(text + "\n")
