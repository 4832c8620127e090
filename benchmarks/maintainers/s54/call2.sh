#!/usr/bin/env bash
# Session 54, call 2 (scratch), a fresh machine carrying only .whl: the standard suite first (on an
# H200 with the remade table: the 150-s check), then the GPU tests in 8 processes, the early-tower
# A/B (s53), and on an H200 the conv's distance from its memory bound (kernel_lab conv_bandwidth).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
WORKLOADS='workloads/*.yaml' BUDGET=${SUITE_BUDGET:-280} bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
echo "== GPU tests at $(($(date +%s) - START)) s"
timeout -s INT -k 20 170 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-200 | tail -20
echo "== early tower at $(($(date +%s) - START)) s"
OUT=$OUT/early TOTAL=130 CALLS=120 bash benchmarks/maintainers/s53/call_early.sh
if [[ "$name" == *H200* ]] && [ $(($(date +%s) - START)) -lt 500 ]; then
  echo "== conv_bandwidth at $(($(date +%s) - START)) s"
  timeout $((570 - ($(date +%s) - START))) python3 benchmarks/maintainers/kernel_lab.py --only conv_bandwidth \
    --out "$OUT/kernel_lab.json" 2>&1 | tee "$OUT/kernel_lab.txt" | grep -v '^\s*$' | tail -30
fi
ls -la "$OUT" "$OUT/early"
echo "call done at $(($(date +%s) - START)) s"
