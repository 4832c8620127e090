#!/usr/bin/env bash
# Session 49, call 9 (any card), the vision stage's host path trimmed in the tree: s49/vision_host.py
# (the tree against 1b0edfd's code, call by call), then the GPU tests of the runtime and images.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/maintainers/s49/vision_host.py "$OUT/vision_host_ab.json" 2>&1 | grep -v "^USDT" | tail -4
echo "lab done at $(($(date +%s) - START)) s"
timeout -s INT 100 python3 -m pytest -q tests/gpu/test_runtime.py tests/gpu/test_images_device.py -n 8 -p no:cacheprovider -rfE 2>&1 \
  | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -6
echo "tests done at $(($(date +%s) - START)) s"
