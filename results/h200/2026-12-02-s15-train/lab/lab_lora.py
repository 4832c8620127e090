"""Scratch A/B (session 15): linear_group's two orders at train-step-2b's shapes, BF16, N = 4096.
A: base GEMM, then each adapter's rank-r update accumulated into its columns (addmm_, beta 1).
B (the repo's): the adapters' updates through a block-diagonal B first, the base GEMM accumulating onto them."""
import json, sys, torch
import torch.nn.functional as F
sys.path.insert(0, ".")
import dohnuts.model.lora as L
ns = {"torch": torch, "nn": torch.nn, "F": F, "LoRALinear": L.LoRALinear}
exec(open(".gl/variant_a.py").read(), ns)
A = ns["_LinearGroup"]; B = L._LinearGroup
dev, dt, N, r = "cuda", torch.bfloat16, 4096, 16
g = torch.Generator(device=dev).manual_seed(0)
def t(*s, grad=False):
    x = (torch.randn(*s, device=dev, generator=g) * 0.02).to(dt)
    return x.requires_grad_(grad)
groups = {"gate+up": (2048, (6144, 6144), (True, True)), "qkv+b+a": (2048, (6144, 16, 16), (True, False, False)),
          "z": (2048, (2048,), (True,)), "down": (6144, (2048,), (True,))}
res = {}
def timed(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1000  # µs
for name, (fin, outs, lora) in groups.items():
    x = t(N, fin, grad=True); w = t(sum(outs), fin)
    spans, scales, ab, col = [], [], [], 0
    for n_, l in zip(outs, lora):
        if l:
            spans.append((col, col + n_)); scales.append(2.0); ab += [t(r, fin, grad=True), t(n_, r, grad=True)]
        col += n_
    dy = t(N, col)
    row = {}
    row["base only fwd"] = timed(lambda: F.linear(x, w))
    xb = x.detach().requires_grad_()
    row["base only fwd+bwd"] = timed(lambda: F.linear(xb, w).backward(dy))
    ys = {}
    for label, fn in (("A", A), ("B", B)):
        with torch.no_grad():
            row[f"{label} fwd"] = timed(lambda: fn.apply(x, None, w, None, tuple(spans), tuple(scales), *ab))
        row[f"{label} fwd+bwd"] = timed(lambda: fn.apply(x, None, w, None, tuple(spans), tuple(scales), *ab).backward(dy))
        for p in [x] + ab: p.grad = None
        y = fn.apply(x, None, w, None, tuple(spans), tuple(scales), *ab); y.backward(dy)
        ys[label] = [y.detach().float()] + [p.grad.float().clone() for p in [x] + ab]
    # agreement A vs B (BF16 rounding order differs)
    row["max rel diff A vs B"] = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(ys["A"], ys["B"]))
    res[name] = row
    print(name, {k: round(v, 2) if "diff" not in k else f"{v:.1e}" for k, v in row.items()}, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
