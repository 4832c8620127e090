#!/usr/bin/env bash
# Session 49, call 3 (any card), the tall path in the tree: device time by kernel (s49/tall_profile.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/maintainers/s49/tall_profile.py "$OUT/tall_profile.json" 2>&1 | grep -v "^USDT" | tail -24
