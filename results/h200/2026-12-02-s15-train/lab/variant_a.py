class _LinearGroup(torch.autograd.Function):
    """y = x Wᵀ (+ bias), then y[:, cols_i] += s_i · (xd A_iᵀ) B_iᵀ for each adapter i.

    x (N, in) and xd (the adapters' input after dropout; None: x itself), W (Σout, in), the
    adapters' A_i (r_i, in) and B_i (out_i, r_i), all in one dtype; `spans` are the adapters'
    column ranges in y, `scales` their α / r. The base weight and bias are frozen (a LoRA base);
    the backward computes their gradients anyway if asked."""

    @staticmethod
    def forward(ctx, x, xd, w, bias, spans, scales, *ab):
        a_parts, bs = ab[0::2], ab[1::2]
        a = a_parts[0] if len(a_parts) == 1 else torch.cat(a_parts)  # (Σr, in)
        y = torch.mm(x, w.t()) if bias is None else torch.addmm(bias, x, w.t())  # (N, Σout)
        u = torch.mm(x if xd is None else xd, a.t())  # (N, Σr): every adapter's rank-r activations at once
        r0 = 0
        for (c0, c1), s, b in zip(spans, scales, bs):
            r1 = r0 + b.shape[1]
            y[:, c0:c1].addmm_(u[:, r0:r1], b.t(), alpha=s)  # in place: cuBLAS with C = D, no copy of y
            r0 = r1
        ctx.spans, ctx.scales, ctx.ranks = spans, scales, [b.shape[1] for b in bs]
        ctx.dropout = xd is not None
        ctx.save_for_backward(x, xd, w, a, u, *bs)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, xd, w, a, u, *bs = ctx.saved_tensors
        need = ctx.needs_input_grad
        dy = dy.contiguous()
        du_parts, dbs, r0 = [], [], 0
        for (c0, c1), s, b, r in zip(ctx.spans, ctx.scales, bs, ctx.ranks):
            g = dy[:, c0:c1]  # (N, out_i), a column block: cuBLAS reads it in place
            du_parts.append(torch.mm(g, b).mul_(s))
            dbs.append(torch.mm(g.t(), u[:, r0:r0 + r]).mul_(s) if need[7 + 2 * len(dbs)] else None)
            r0 += r
        du = du_parts[0] if len(du_parts) == 1 else torch.cat(du_parts, dim=1)  # (N, Σr)
        dx = dxd = None
        if need[0]:
            dx = torch.mm(dy, w)
            if not ctx.dropout:
                dx.addmm_(du, a)  # the adapters' share accumulated by the GEMM: no separate sum
        if ctx.dropout and need[1]:
            dxd = torch.mm(du, a)
        da = torch.mm(du.t(), x if xd is None else xd)  # (Σr, in)
        das = da.split(ctx.ranks)
        dw = torch.mm(dy.t(), x) if need[2] else None
        dbias = dy.sum(0) if need[3] else None
        grads = [g for pair in zip(das, dbs) for g in pair]
        return dx, dxd, dw, dbias, None, None, *grads


