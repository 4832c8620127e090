#!/usr/bin/env bash
# Session 48, call 1 and 2 (any card), on branch train-fusions-s48: the SwiGLU kernel lab and the
# train-step A/B (s48/train_ab.py), then the GPU tests whole with the levers on.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/maintainers/s48/train_ab.py "$OUT/train_ab.json" 2>&1 | grep -v "^USDT" | tail -60
echo "A/B done at $(($(date +%s) - START)) s"
timeout -s INT 220 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR|Error' | cut -c1-300 | tail -20
echo "tests done at $(($(date +%s) - START)) s"
