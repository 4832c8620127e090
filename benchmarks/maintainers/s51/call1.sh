#!/usr/bin/env bash
# Session 51, call 1 (asked as nvidia-h200). On an H200: the tuned table remade from an empty cache
# (the suite and text-4b with their kernels recorded, the GPU tests after them, the tuned and compiled
# tables). On any other card: the GPU tests (8 processes) on the landed collate (torch views of the
# pinned buffer, never run on a GPU), then s51/swiglu_gemm_lab.py (the gate/up GEMM with SwiGLU in its
# epilogue against cuBLAS then the SwiGLU kernel).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 \
    COMPILED_TABLE=1 BUDGET=560 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -40
else
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
  timeout -s INT -k 20 300 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 \
    | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -20
  timeout -s INT 240 python3 benchmarks/maintainers/s51/swiglu_gemm_lab.py "$OUT/swiglu_gemm_lab.json" 2>&1 | tail -12 | cut -c1-1500
fi
