#!/usr/bin/env bash
# Session 40, on an H200 after call A's table landed: the 150-s check — the standard suite first on a
# fresh machine (empty Triton cache, the new table), then the GPU tests (8 processes).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
WORKLOADS='workloads/*.yaml' BUDGET=330 bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout -s INT -k 20 220 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-200 | tail -20
