#!/usr/bin/env bash
# Session 53's prepared call (not run: no device time left), on branch early-tower-s53, any CUDA card
# (carry [".whl"]): s53/early_tower_ab.py — single cold image calls with the tower started on the
# preparing thread's stream against main's, 150 calls each taking turns (≈ 2 minutes with the loads).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout -s INT "${TOTAL:-300}" python3 benchmarks/maintainers/s53/early_tower_ab.py "$OUT/early_tower_ab.json" "${CALLS:-150}" \
  2>&1 | grep -v "^USDT" | tee "$OUT/early_tower_ab.log" | tail -6 | cut -c1-1500
echo "passes left eager (a failed capture): $(grep -c 'cannot be captured' "$OUT/early_tower_ab.log")"
echo "all done at $(($(date +%s) - START)) s"
