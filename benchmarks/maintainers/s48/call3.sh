#!/usr/bin/env bash
# Session 48, call 3 (any card): the rank-r GEMMs' headroom (s48/skinny_lab.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/maintainers/s48/skinny_lab.py "$OUT/skinny_lab.json" 2>&1 | grep -v "^USDT" | tail -20
