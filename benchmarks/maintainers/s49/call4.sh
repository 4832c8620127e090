#!/usr/bin/env bash
# Session 49, call 4 (any card), the adapters' gradients added into .grad in the tree: device time by
# kernel (s49/grad_profile.py), the train-step A/B (s49/grad_ab.py), then the GPU tests whole.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/maintainers/s49/grad_profile.py "$OUT/grad_profile.json" 2>&1 | grep -v "^USDT" | tail -22
echo "profile done at $(($(date +%s) - START)) s"
timeout 200 python3 benchmarks/maintainers/s49/grad_ab.py "$OUT/grad_ab.json" 5 2>&1 | grep -v "^USDT" | tail -2
echo "A/B done at $(($(date +%s) - START)) s"
timeout -s INT 200 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -6
echo "tests done at $(($(date +%s) - START)) s"
