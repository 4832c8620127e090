#!/usr/bin/env bash
# Session 45, call 1: the failed-capture lab, then the GPU tests whole and the standard suite (fresh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 benchmarks/maintainers/s45/failed_capture.py "$OUT/failed_capture.txt" 2>&1 | tail -12
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=470 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
