#!/usr/bin/env bash
# Session 49, call 5 (any card): s49/launch_lab.py — a CUDA graph's launch from an idle GPU, whole
# against a small head graph then the rest (synthetic chains, the 2b tower).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/maintainers/s49/launch_lab.py "$OUT/launch_lab.json" 2>&1 | grep -v "^USDT" | tail -12
