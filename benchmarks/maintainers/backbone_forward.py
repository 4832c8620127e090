"""Backbone forward throughput: dohnuts' fused text backbone beside transformers' Qwen3_5TextModel
on the same weights, hidden states only, in one process.

    python benchmarks/maintainers/backbone_forward.py --preset qwen3.5-2b --batch 32 --seq 512 --out results.json

Times each forward with CUDA events after warm-up (median of --repeat), random token ids (never
zeros), BF16 weights, no padding. Reports tokens/s of both and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys

import torch

from dohnuts import ops
from dohnuts.ops._dispatch import reference as reference_ops  # private: the parity tooling's switch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3.5-2b")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("backbone_forward: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from dohnuts.config import preset
    from dohnuts.hf_config import to_hf_text_config
    from dohnuts.model.build import build_text_backbone
    from dohnuts.runtime.timing import device_times_ms

    cfg = preset(args.preset)
    dev = torch.device("cuda")
    ours, _ = build_text_backbone(cfg, device=dev, dtype=torch.bfloat16, seed=0)
    ours.eval()
    hf_cfg = Qwen3_5TextConfig(**to_hf_text_config(cfg.text))
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = Qwen3_5TextModel(hf_cfg)
    hf.load_state_dict(ours.state_dict(), assign=True)  # the very same tensors
    hf.rotary_emb = Qwen3_5TextRotaryEmbedding(config=hf_cfg).to(dev)
    hf.eval()
    gen = torch.Generator(device=dev).manual_seed(0)
    ids = torch.randint(0, cfg.text.vocab_size, (args.batch, args.seq), device=dev, generator=gen)
    tokens = args.batch * args.seq
    result = {"preset": args.preset, "batch": args.batch, "seq": args.seq, "dtype": "bf16",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.inference_mode():
        a, _ = ours(ids[:4])
        b = hf(input_ids=ids[:4], use_cache=False).last_hidden_state
        result["relative_difference"] = _rel(a, b)
        # Both BF16 runs against an FP32 plain-torch run of the same weights (4 sequences):
        # BF16 drift, not a mistake, if both sit at a similar distance from it.
        ref = copy.deepcopy(ours).float()
        with reference_ops():
            c, _ = ref(ids[:4])
        result["relative_error_vs_fp32"] = {"dohnuts": _rel(a, c), "transformers": _rel(b, c)}
        del ref, c
        torch.cuda.empty_cache()
        for name, fn in (("dohnuts", lambda: ours(ids)),
                         ("transformers", lambda: hf(input_ids=ids, use_cache=False))):
            ms = device_times_ms(fn, args.warmup, args.repeat)
            med = statistics.median(ms)
            result[name] = {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms), "tokens_per_s": tokens / (med / 1e3)}
    result["speedup"] = result["transformers"]["median_ms"] / result["dohnuts"]["median_ms"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
