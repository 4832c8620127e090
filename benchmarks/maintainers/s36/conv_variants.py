"""Scratch (session 36): the shared conv kernel's row arithmetic in 32 bits (the tree) against 64
(`int64_conv_kernel.py`, the branch at 6a78453), beside the two launches and cat it replaces and one
plain launch over every row (the bound), at shared-prefix-2b's and image-cache-warm-2b's shapes, CUDA
graphs, interleaved (kernel_lab's `_ab`); the outputs compared.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s36/conv_variants.py OUT.json
"""
import importlib.util, json, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from kernel_lab import _ab  # noqa: E402

from dohnuts.config import preset
from dohnuts.ops._conv_kernel import conv_silu_parts_triton, conv_silu_shared_triton

spec_ = importlib.util.spec_from_file_location("int64_conv_kernel", Path(__file__).with_name("int64_conv_kernel.py"))
old = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(old)

cfg = preset("qwen3.5-2b").text
K = cfg.linear_key_head_dim
sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
D, W = sum(sizes), cfg.linear_conv_kernel_dim
out = {}
for P, n, L in ((448, 32, 64), (192, 8, 262)):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = torch.randn(P + n * L, D + 32, device="cuda", generator=gen).bfloat16()[..., :D]
    w = (0.3 * torch.randn(D, W, device="cuda", generator=gen)).bfloat16().t().contiguous().t()
    fin = torch.empty(1, D, W, device="cuda", dtype=torch.bfloat16)

    def two_launches():
        _, k_p, _ = conv_silu_parts_triton(rows[:P].unsqueeze(0), w, K, sizes, normalized_parts=2, final_state=fin)
        _, k_s, _ = conv_silu_parts_triton(rows[P:].view(n, L, D), w, K, sizes, normalized_parts=2,
                                           initial_state=fin.expand(n, -1, -1))
        return torch.cat([k_p.reshape(-1), k_s.reshape(-1)])

    fns = {"two launches + cat of k": two_launches,
           "shared, 64-bit rows": lambda: old.conv_silu_shared_triton(rows, w, K, sizes, P, L, normalized_parts=2),
           "shared, 32-bit rows (tree)": lambda: conv_silu_shared_triton(rows, w, K, sizes, P, L, normalized_parts=2),
           "one plain launch": lambda: conv_silu_parts_triton(rows.unsqueeze(0), w, K, sizes, normalized_parts=2)}
    a = torch.cat([y.reshape(-1) for y in fns["shared, 64-bit rows"]()]).float()
    b = torch.cat([y.reshape(-1) for y in fns["shared, 32-bit rows (tree)"]()]).float()
    ms = _ab(fns, graph=True)
    key = f"{P}+{n}x{L}"
    out[key] = {"us": {k: round(v * 1e3, 2) for k, v in ms.items()}, "max_abs_difference": (a - b).abs().max().item()}
    print(key, json.dumps(out[key]), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
