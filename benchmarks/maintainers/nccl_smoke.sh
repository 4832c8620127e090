#!/usr/bin/env bash
# Two-GPU smoke test (nvidia-h200-x2; any two CUDA or ROCm GPUs: torch's "nccl" backend is RCCL on
# ROCm): a 2-process training run and a 2-process predict, each ending normally (the ranks meet at
# a barrier before tearing their process groups down).
#   MODEL (default qwen3.5-0.8b), TRAIN_TIMEOUT seconds (default 80; a fresh machine compiles the
#   backward kernels first — carry the Triton cache, docs/gpu.md)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .triton_cache
[ -f .triton_cache.tgz ] && tar xzf .triton_cache.tgz
if ls .whl/*.whl >/dev/null 2>&1; then  # the carried wheels (docs/gpu.md); elsewhere: installed already
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
fi
# NCCL_NVLS_ENABLE: NVLink multicast off on NVIDIA (docs/gpu.md); RCCL ignores it.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache NCCL_NVLS_ENABLE=0
MODEL=${MODEL:-qwen3.5-0.8b}
{
  timeout "${TRAIN_TIMEOUT:-80}" python3 -m dohnuts.cli train --model "$MODEL" --out /tmp/smoke --updates 2 --eval-every 2 \
    --synthetic-train 16 --nproc-per-node 2 2>&1 | tail -2; echo "train exit: ${PIPESTATUS[0]}"
  python3 -c "
import json
for i in range(6):
    print(json.dumps({'id': f'r{i}', 'questions': [{'id': 'q', 'text': f'question {i}?', 'candidates': ['yes', 'no']}]}))
" > /tmp/req.jsonl
  timeout 60 python3 -m dohnuts.cli predict --model "$MODEL" /tmp/req.jsonl -o /tmp/pred.jsonl --nproc-per-node 2 2>&1 \
    | tail -2; echo "predict exit: ${PIPESTATUS[0]}, $(wc -l < /tmp/pred.jsonl) results"
} 2>&1 | tee "$OUT/nccl_smoke.txt"
