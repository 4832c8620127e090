"""Scratch lab (session 34): the shared pass's per-layer small launches, prefix and suffixes apart
against one launch over all rows. PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s34/merge_lab.py OUT.json"""
import json, statistics, sys
import torch
from dohnuts.ops.delta_rule import _kkt_solve, _kkt_kernel, _KKT_CONFIG, CHUNK
from dohnuts.ops._fla import fla
from dohnuts.ops._conv_bwd_kernel import conv_silu_parts
from dohnuts.ops._gdn_gates_kernel import gdn_gates
import triton

dev = "cuda"
H = HV = 16; K = 128; C = 3 * 2048


def bench(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


def kkt_varlen(k, g, beta, cu, ci):
    A = torch.empty(*k.shape[:2], HV, CHUNK, device=dev, dtype=k.dtype)
    _kkt_kernel()[(ci.shape[0], HV)](k=k, g=g, beta=beta, A=A, cu_seqlens=cu, chunk_indices=ci, T=k.shape[1], H=H,
                                      HV=HV, K=K, BT=CHUNK, BC=16, USE_G=True, IS_VARLEN=True, **_KKT_CONFIG)
    return A


out = {}
f = fla()
for name, (p, n, L) in {"shared-prefix": (448, 32, 64), "image-warm": (192, 8, 262)}.items():
    R = p + n * L
    torch.manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(1, R, H, K, device=dev), dim=-1).bfloat16()
    gl = -torch.rand(1, R, HV, device=dev) * 0.1
    # chunk-local cumsum per sequence
    seqs = [(0, p)] + [(p + i * L, L) for i in range(n)]
    g = torch.empty_like(gl)
    for s0, ln in seqs:
        for c0 in range(0, ln, CHUNK):
            e = min(ln, c0 + CHUNK)
            g[:, s0 + c0:s0 + e] = gl[:, s0 + c0:s0 + e].cumsum(1)
    beta = torch.rand(1, R, HV, device=dev)
    kp, gp, bp = k[:, :p], g[:, :p], beta[:, :p]
    ks, gs, bs = (x[:, p:].reshape(n, L, *x.shape[2:]) for x in (k, g, beta))
    cu = torch.tensor([0] + [p + i * L for i in range(n + 1)], dtype=torch.int32, device=dev)
    ci = torch.tensor([[0, c] for c in range(p // CHUNK)] + [[s + 1, c] for s in range(n) for c in range(-(-L // CHUNK))],
                      dtype=torch.int32, device=dev)
    r = {}
    r["kkt prefix"] = bench(lambda: _kkt_solve(f, kp, gp, bp))
    r["kkt suffixes"] = bench(lambda: _kkt_solve(f, ks, gs, bs))
    r["kkt both, two launches"] = bench(lambda: (_kkt_solve(f, kp, gp, bp), _kkt_solve(f, ks, gs, bs)))
    r["kkt one varlen launch"] = bench(lambda: kkt_varlen(k, g, beta, cu, ci))
    if L % CHUNK == 0:
        r["kkt one flat launch"] = bench(lambda: _kkt_solve(f, k, g, beta))
    # parity: the varlen launch's A equals the two launches' (lower blocks; upper left unwritten)
    A2 = torch.cat([_kkt_solve(f, kp, gp, bp, True).reshape(p, HV, CHUNK),
                    _kkt_solve(f, ks, gs, bs, True).reshape(n * L, HV, CHUNK)])
    Av = torch.zeros(1, R, HV, CHUNK, device=dev, dtype=k.dtype)
    _kkt_kernel()[(ci.shape[0], HV)](k=k, g=g, beta=beta, A=Av, cu_seqlens=cu, chunk_indices=ci, T=R, H=H, HV=HV, K=K,
                                     BT=CHUNK, BC=16, USE_G=True, IS_VARLEN=True, **_KKT_CONFIG)
    r["kkt varlen equals two launches"] = bool(torch.equal(Av.reshape(R, HV, CHUNK), A2))
    kpv, ksv = kp.reshape(p, H, K), ks.reshape(n * L, H, K)
    r["cat of k"] = bench(lambda: torch.cat([kpv, ksv]))
    # conv: prefix then suffixes from its state (two launches) against one launch over all rows
    x = torch.randn(R, C, device=dev, dtype=torch.bfloat16)
    w = torch.randn(C, 4, device=dev, dtype=torch.bfloat16)
    sizes = [2048, 2048, 2048]
    def conv_two():
        (_, st) = conv_silu_parts(x[:p].view(1, p, C), w, 128, sizes, normalized_parts=2, output_final_state=True)
        conv_silu_parts(x[p:].view(n, L, C), w, 128, sizes, normalized_parts=2, initial_state=st.expand(n, -1, -1))
    r["conv two launches"] = bench(conv_two)
    r["conv one launch over all rows"] = bench(lambda: conv_silu_parts(x.view(1, R, C), w, 128, sizes, normalized_parts=2))
    a = torch.randn(R, 2 * HV, device=dev, dtype=torch.bfloat16)
    A_log, dt = torch.rand(HV, device=dev), torch.rand(HV, device=dev)
    r["gates two launches"] = bench(lambda: (gdn_gates(a[:p, :HV].view(1, p, HV), a[:p, HV:].view(1, p, HV), A_log, dt, 64, 1.44),
                                            gdn_gates(a[p:, :HV].reshape(n, L, HV), a[p:, HV:].reshape(n, L, HV), A_log, dt, 64, 1.44)))
    r["gates one launch"] = bench(lambda: gdn_gates(a[:, :HV].view(1, R, HV), a[:, HV:].view(1, R, HV), A_log, dt, 64, 1.44))
    o = torch.randn(R, HV, 128, device=dev, dtype=torch.bfloat16)
    r["cat of o"] = bench(lambda: torch.cat([o[:p], o[p:]]))
    out[name] = {k_: (round(v, 2) if isinstance(v, float) else v) for k_, v in r.items()}
    print(name, json.dumps(out[name], indent=1), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
