#!/usr/bin/env bash
# Session 46, call 1 (any card): the failed-capture lab first, then
#   on an H100: the GPU tests whole (the four never run on a GPU among them) and the standard suite on a
#               fresh machine (the cold preparation in the suite, a new H100 reference);
#   on an H200: the table remade from an empty cache (s40/call_a.sh at 8baf8e0): the suite and
#               text-4b with their kernels recorded, the GPU tests after them, the tuned table.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $name"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 benchmarks/maintainers/s46/failed_capture.py "$OUT/failed_capture.txt" 2>&1 | tail -14
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=480 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
else
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=270 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
fi
