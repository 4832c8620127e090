"""Scratch (session 37): the vision tower's GEMMs run ~45 % slower inside the tower than alone (each
layer's 24 MB of weights comes cold from HBM). Does touching the next block's weights into L2 on a
side stream, while this block computes, pay? The landed tower (2b, one 448² image) as a CUDA graph,
each variant interleaved (do_bench_cudagraph medians), outputs compared bit for bit:
- base: the landed tower, written out block by block here;
- start_all / start_qp: at a block's start, the next block's four weights / its qkv and proj;
- mlp_qp: at the block's MLP, the next block's qkv and proj;
- attn_all: after the qkv GEMM (during the rotary and attention), the next block's four weights.
The touch is one Triton kernel a weight on few programs, one load a 32-byte sector (.cg: into L2).
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s37c/prefetch_lab.py OUT.json"""
import json, statistics, sys
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph


@triton.jit
def _touch(W, OUT, n_sectors, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for it in range(ITERS):
        idx = (it * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(W + idx * 16, mask=idx < n_sectors, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


PROGS, BLOCK = 32, 1024
SINK = None


def touch(ws):
    for w in ws:
        n = w.numel() // 16
        _touch[(PROGS,)](w, SINK, n, ITERS=triton.cdiv(n, PROGS * BLOCK), BLOCK=BLOCK, num_warps=4)


def forward(tower, patches, grid, gi, mode, side):
    from dohnuts.model.vision import _check_grids, block_diagonal_attention
    from dohnuts.ops import add_layer_norm, linear_gelu_tanh, rotary_qk

    grids = _check_grids(grid, tower.cfg)
    seqlens = [h * w for t, h, w in grids for _ in range(t)]
    pos, cos, sin = gi
    blocks = list(tower.blocks)
    norms = [*(b.norm1 for b in blocks), tower.merger.norm]
    x = tower.patch_embed(patches)
    ln = lambda a, r, n: add_layer_norm(a, r, n.weight, n.bias, n.eps)  # noqa: E731
    h, x = ln(pos, x, norms[0])
    main = torch.cuda.current_stream()

    def fork(i, which):
        if i + 1 >= len(blocks):
            return False
        nb = blocks[i + 1]
        ws = [nb.attn.qkv.weight, nb.attn.proj.weight] + ([nb.mlp.linear_fc1.weight, nb.mlp.linear_fc2.weight]
                                                           if which == "all" else [])
        side.wait_stream(main)
        with torch.cuda.stream(side):
            touch(ws)
        return True

    for i, blk in enumerate(blocks):
        forked = fork(i, "all" if mode == "start_all" else "qp") if mode in ("start_all", "start_qp") else False
        a = blk.attn
        N = h.shape[0]
        qkv = F.linear(h, a.qkv.weight, a.qkv.bias).view(N, 3, a.num_heads, -1)
        if mode == "attn_all":
            forked = fork(i, "all")
        q, k = rotary_qk(qkv, cos, sin)
        o = block_diagonal_attention(q, k, qkv[:, 2], seqlens)
        h, x = ln(F.linear(o.reshape(N, -1), a.proj.weight, a.proj.bias), x, blk.norm2)
        if mode == "mlp_qp":
            forked = fork(i, "qp")
        m = blk.mlp
        u = linear_gelu_tanh(h, m.linear_fc1.weight, m.linear_fc1.bias)
        h, x = ln(F.linear(u, m.linear_fc2.weight, m.linear_fc2.bias), x, norms[i + 1])
        if forked:
            main.wait_stream(side)
    return tower.merger.project(h)


def main():
    global SINK
    from dohnuts.config import preset
    from dohnuts.model.vision import build_vision_tower
    from dohnuts.runtime.images import pixel_values

    torch.manual_seed(0)
    tower = build_vision_tower(preset("qwen3.5-2b").vision, device="cuda", dtype=torch.bfloat16, seed=0).eval()
    SINK = torch.zeros(PROGS, device="cuda")
    side = torch.cuda.Stream()
    grid = torch.tensor([[1, 28, 28]])
    u8 = torch.randint(0, 256, (784, 768), dtype=torch.uint8, device="cuda")
    with torch.no_grad():
        gi = tower.grid_inputs(grid)
        ref = tower(pixel_values(u8, 2).to(torch.bfloat16), grid, gi)
    res = {"same": {}}
    fns = {}
    for mode in ("base", "start_all", "start_qp", "mlp_qp", "attn_all"):
        def fn(mode=mode):
            with torch.no_grad():
                return forward(tower, pixel_values(u8, 2).to(torch.bfloat16), grid, gi, mode, side)
        res["same"][mode] = bool(torch.equal(fn(), ref))
        fns[mode] = fn
    print(res, flush=True)
    times = {k: [] for k in fns}
    for _ in range(9):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=50))
    res["ms"] = {k: round(statistics.median(v), 4) for k, v in times.items()}
    res["ms_spread"] = {k: [round(min(v), 4), round(max(v), 4)] for k, v in times.items()}
    print(json.dumps(res, indent=1))
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
