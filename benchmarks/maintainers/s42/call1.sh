#!/usr/bin/env bash
# Session 42, call 1 (fresh machine, empty cache): the reference command of s39 (GPU tests whole, then
# the standard suite), then wide_parity.py (BF16 and FP32, training and prediction, two/first/wide).
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=450 bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 100 python3 benchmarks/maintainers/s42/wide_parity.py "$OUT/wide_parity.json" 2>&1 | grep -v "Warn\|Hopper" | tail -45
