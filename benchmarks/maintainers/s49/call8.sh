#!/usr/bin/env bash
# Session 49, call 8 (any card): s49/vision_host.py — a single cold call's vision stage, its host time
# before the tower's replay by step.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/maintainers/s49/vision_host.py "$OUT/vision_host.json" 2>&1 | grep -v "^USDT" | tail -8
