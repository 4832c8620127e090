"""Scratch A/B (session 35, kept at one commit for the ledger, M48): a row-loop variant of the conv kernel — each program walks its tokens one row
at a time, keeping the previous W − 1 = 3 input rows in registers (each input row loaded once, no
shifted re-loads) — against the landed kernel at text-2b's stateless pass (q/k normalised), and a
torch copy of the same bytes. CPU: TRITON_INTERPRET=1 checks the numbers at a small shape."""
import os, statistics, sys
import torch, triton, triton.language as tl


@triton.jit
def _conv_rows(X, Wt, Y, T, C, sxb, sxt, swc, swk, eps, c1, c2, norm_ch, D: tl.constexpr, BT: tl.constexpr,
               NORM: tl.constexpr):
    h = tl.program_id(0)
    i_t = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    ch = h * D + tl.arange(0, D)
    c0 = h * D
    start = tl.where(c0 >= c2, c2, tl.where(c0 >= c1, c1, 0)).to(tl.int64)
    width = tl.where(c0 >= c2, C, tl.where(c0 >= c1, c2, c1)).to(tl.int64) - start
    Yp = Y + tl.num_programs(2).to(tl.int64) * T * start + b * T * width + (ch - start)
    norm = c0 < norm_ch
    w0 = tl.load(Wt + ch * swc).to(tl.float32)
    w1 = tl.load(Wt + ch * swc + swk).to(tl.float32)
    w2 = tl.load(Wt + ch * swc + 2 * swk).to(tl.float32)
    w3 = tl.load(Wt + ch * swc + 3 * swk).to(tl.float32)
    Xb = X + b * sxb + ch
    t0 = i_t * BT
    x1 = tl.load(Xb + (t0 - 1) * sxt, mask=(ch * 0 + t0) >= 1, other=0.0).to(tl.float32)
    x2 = tl.load(Xb + (t0 - 2) * sxt, mask=(ch * 0 + t0) >= 2, other=0.0).to(tl.float32)
    x3 = tl.load(Xb + (t0 - 3) * sxt, mask=(ch * 0 + t0) >= 3, other=0.0).to(tl.float32)
    for j in range(BT):
        t = t0 + j
        if t < T:
            xt = tl.load(Xb + t.to(tl.int64) * sxt).to(tl.float32)
            acc = tl.zeros([D], dtype=tl.float32)
            acc += x3 * w0
            acc += x2 * w1
            acc += x1 * w2
            acc += xt * w3
            y = acc * tl.sigmoid(acc)
            if NORM:
                if norm:
                    y = y / tl.sqrt(tl.sum(y * y, axis=0) + eps)
            tl.store(Yp + t.to(tl.int64) * width, y.to(Y.dtype.element_ty))
            x3 = x2
            x2 = x1
            x1 = xt


def conv_rows(x, w, head_dim, sizes, normalized_parts, bt=64, warps=1):
    B, T, C = x.shape
    y = torch.empty(B * T * C, dtype=x.dtype, device=x.device)
    c1, c2 = sizes[0], sizes[0] + sizes[1]
    norm_ch = sum(sizes[:normalized_parts])
    grid = (C // head_dim, triton.cdiv(T, bt), B)
    _conv_rows[grid](x, w, y, T, C, x.stride(0), x.stride(1), w.stride(0), w.stride(1), 1e-6, c1, c2, norm_ch,
                     D=head_dim, BT=bt, NORM=norm_ch > 0, num_warps=warps)
    return y


def main():
    from dohnuts.ops._conv_kernel import conv_silu_parts_triton
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        N, T, K, sizes = 2, 37, 16, [32, 32, 48]
    else:
        N, T, K, sizes = 32, 512, 128, [2048, 2048, 2048]
    D, W = sum(sizes), 4
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, T, D + 32, device=dev, generator=g).bfloat16()[..., :D]
    w = (0.3 * torch.randn(D, W, device=dev, generator=g)).bfloat16().t().contiguous().t()
    landed = torch.cat([t.reshape(-1) for t in conv_silu_parts_triton(x, w, K, sizes, normalized_parts=2,
                                                                      **({} if dev == "cuda" else {"cpu_block_t": 16}))])
    res = {}
    for bt, warps in ((64, 1), (32, 1), (128, 1), (64, 2), (16, 1)) if dev == "cuda" else ((16, 1), (8, 1)):
        y = conv_rows(x, w, K, sizes, 2, bt, warps)
        diff = (y.float() - landed.float()).abs().max().item()
        res[(bt, warps)] = (torch.equal(y, landed), diff)
        print("rows", bt, warps, "equal", torch.equal(y, landed), "max diff", diff, flush=True)
    if dev == "cpu":
        return
    from triton.testing import do_bench_cudagraph
    copy_to = torch.empty(N, T, D, device=dev, dtype=torch.bfloat16)
    fns = {"landed": lambda: conv_silu_parts_triton(x, w, K, sizes, normalized_parts=2),
           "copy": lambda: copy_to.copy_(x)}
    for bt, warps in res:
        fns[f"rows {bt}/{warps}"] = (lambda bt=bt, warps=warps: conv_rows(x, w, K, sizes, 2, bt, warps))
    times = {k: [] for k in fns}
    for _ in range(3):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=40))
    gb = 2 * N * T * D * 2 / 1e9
    for k, v in times.items():
        m = statistics.median(v)
        print(f"{k:14s} {m * 1e3:7.1f} us  {gb / m:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
