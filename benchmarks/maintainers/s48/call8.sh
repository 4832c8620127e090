#!/usr/bin/env bash
# Session 48, call 8 (any card), on branch split-grad-once: the split A/B (s48/split_ab.py: the two
# kernels' layouts alone, then four models, two of each), then the GPU tests whole.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/maintainers/s48/split_ab.py "$OUT/split_ab.json" 2>&1 | grep -v "^USDT" | tail -4
echo "A/B done at $(($(date +%s) - START)) s"
timeout -s INT 150 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -6
echo "tests done at $(($(date +%s) - START)) s"
