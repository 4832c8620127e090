#!/usr/bin/env bash
# Session 46, the lean call (little device time left): the failed-capture lab, then the GPU runtime
# and training tests (the fresh pool after a failed capture, the capture tests' reworked helper).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 60 python3 benchmarks/maintainers/s46/failed_capture.py "$OUT/failed_capture.txt" 2>&1 | tail -12
timeout -s INT -k 20 200 python3 -m pytest -q tests/gpu/test_runtime.py tests/gpu/test_training.py -n 4 -p no:cacheprovider -rfE \
  2>&1 | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR|^E ' | cut -c1-240 | tail -30
