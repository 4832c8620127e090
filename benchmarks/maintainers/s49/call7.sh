#!/usr/bin/env bash
# Session 49, call 7 (any card): s49/launch_nodes.py — a graph's launch by its node types (synthetic
# chains with memcpy nodes; the captured passes of shared-prefix-2b, image-cache-warm-2b, text-2b).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/maintainers/s49/launch_nodes.py "$OUT/launch_nodes.json" 2>&1 | grep -v "^USDT" | tail -12
