#!/usr/bin/env bash
# Session 49, call 2 (any card), the tall path in the tree: its train-step A/B (s49/tall_ab.py, two
# copies of each variant, five rotated rounds), then the GPU tests whole.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/maintainers/s49/tall_ab.py "$OUT/tall_ab.json" 5 2>&1 | grep -v "^USDT" | tail -4
echo "A/B done at $(($(date +%s) - START)) s"
timeout -s INT 200 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -6
echo "tests done at $(($(date +%s) - START)) s"
