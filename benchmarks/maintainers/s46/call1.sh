#!/usr/bin/env bash
# Session 46, call 1 (any card): the failed-capture lab, then the GPU tests whole and the standard
# suite on a fresh machine (on an H200 also the 150-s check on the hand-edited table).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $name"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 benchmarks/maintainers/s46/failed_capture.py "$OUT/failed_capture.txt" 2>&1 | tail -12
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=270 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
