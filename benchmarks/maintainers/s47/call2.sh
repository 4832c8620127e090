#!/usr/bin/env bash
# Session 47, call 2 (main at this commit). On an H200 (none lent since session 31): the table remade
# from an empty cache (s40/call_a.sh at 8baf8e0) — the suite and text-4b first, their kernels recorded
# (COMPILED_TABLE), the GPU tests after them, the tuned table from the cache (TUNE_TABLE); the suite's
# clock is a fresh H200's (the 150-s question, on the old table). On an H100: where train-step's
# device time outside the GEMMs comes from (s47/train_glue.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=560 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -60
else
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 400 python3 benchmarks/maintainers/s47/train_glue.py \
    "$OUT/train_glue.txt" 2>&1 | grep -v "^USDT" | head -120
fi
