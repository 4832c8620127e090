#!/usr/bin/env bash
# Session 45, call 1: the failed-capture lab, then on an H100 the GPU tests whole and the standard
# suite (fresh); on an H200 (none lent since session 31) the table remade from an empty cache as
# s40/call_a.sh did (suite + text-4b recorded, GPU tests after, the tuned table from the cache).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $name"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 benchmarks/maintainers/s45/failed_capture.py "$OUT/failed_capture.txt" 2>&1 | tail -12
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=540 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
else
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=470 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
fi
