"""The distribution of BF16 drift that the GPU parity gates are set from.

    python benchmarks/maintainers/bf16_drift.py --out bf16_drift.json

A 4-layer backbone at Qwen3.5-2b widths (3 Gated DeltaNet layers, 1 attention layer), over several
weight seeds and input shapes: the relative error of its hidden states against an FP32 run of the
same weights, for the fused BF16 path (`fused`) and the plain-torch ops run in BF16 (`plain`: the
mathematics without our kernels, rounded as ours are); and, per seed, the packed projections as
tests/gpu/test_model.py runs them (3 rows of 633 tokens sharing 300; one full pass, and the prefix
then the suffixes from its forked state): `packed` and `unpacked` against FP32, and `packed_vs_unpacked`.
tests/gpu/test_model.py states this distribution and sets its gates from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import torch
from msgspec.structs import replace

from dohnuts.ops._dispatch import reference as reference_ops  # private: the parity tooling's switch

SEEDS = range(8)
SHAPES = ((4, 333), (8, 128), (2, 1000), (16, 64))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _packed(plain, ref32, seed: int, dev) -> list[dict]:
    """tests/gpu/test_model.py::test_packed_backbone_bf16_keeps_the_mathematics's measurement."""
    import copy

    from dohnuts.model.packing import fuse_projections

    packed = copy.deepcopy(plain)
    fuse_projections(packed)
    P = 300
    gen = torch.Generator(device=dev).manual_seed(2000 + seed)
    ids = torch.randint(0, 20000, (3, 333 + P), device=dev, generator=gen)
    ids[1:, :P] = ids[0, :P]

    def passes(model):
        full, _ = model(ids)
        head, state = model(ids[:1, :P], return_state=True)
        tail, _ = model(ids[:, P:], state=state.fork(3))
        return full.float(), torch.cat([head.expand(3, -1, -1), tail], 1).float()

    with torch.no_grad():
        got, want = passes(packed), passes(plain)
        with reference_ops():
            truth = passes(ref32)
    out = []
    for name, g, w, t in zip(("full", "prefix+suffix"), got, want, truth):
        row = {"seed": seed, "pass": name, "packed": _rel(g, t), "unpacked": _rel(w, t), "packed_vs_unpacked": _rel(g, w)}
        row["packed_ratio"] = row["packed"] / row["unpacked"]
        print(f"seed {seed} packed {name:<13} packed {row['packed']:.4e}  unpacked {row['unpacked']:.4e}  "
              f"packed/unpacked {row['packed_vs_unpacked']:.4e}")
        out.append(row)
    del packed
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bf16_drift: needs a CUDA GPU", file=sys.stderr)
        return 2
    from dohnuts.config import preset
    from dohnuts.model.build import build_text_backbone

    cfg = preset("qwen3.5-2b")
    cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=4, layer_types=()))
    dev = torch.device("cuda")
    rows = []
    for seed in SEEDS:
        fused, _ = build_text_backbone(cfg, device=dev, dtype=torch.bfloat16, seed=seed)
        ref32, _ = build_text_backbone(cfg, device=dev, dtype=torch.float32, seed=seed)
        gen = torch.Generator(device=dev).manual_seed(1000 + seed)
        for B, L in SHAPES:
            ids = torch.randint(0, 20000, (B, L), device=dev, generator=gen)
            with torch.no_grad():
                h_fused, _ = fused(ids)
                with reference_ops():
                    h_plain, _ = fused(ids)
                    h_ref32, _ = ref32(ids)
            row = {"seed": seed, "batch": B, "length": L, "fused": _rel(h_fused, h_ref32),
                   "plain": _rel(h_plain, h_ref32)}
            row["ratio"] = row["fused"] / row["plain"]
            rows.append(row)
            print(f"seed {seed} {B:>2} × {L:<4}  fused {row['fused']:.4e}  plain {row['plain']:.4e}  "
                  f"ratio {row['ratio']:.3f}")
        rows += _packed(fused, ref32, seed, dev)
        del fused, ref32
        torch.cuda.empty_cache()
    summary = {}
    for key in ("fused", "plain", "ratio", "packed", "unpacked", "packed_ratio", "packed_vs_unpacked"):
        vals = sorted(r[key] for r in rows if key in r)
        summary[key] = {"min": vals[0], "median": statistics.median(vals), "max": vals[-1], "n": len(vals)}
        print(f"{key:>6}: min {vals[0]:.4e}  median {statistics.median(vals):.4e}  max {vals[-1]:.4e}  (n={len(vals)})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
