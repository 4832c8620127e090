#!/usr/bin/env bash
# Session 36's second call (scratch; main with the shared conv merged, .whl carried). On a fresh H200:
# the standard suite from an empty cache with its kernels recorded, the GPU tests, the table remade
# from that cache; on any card: the training A/B of the shared conv, then the conv labs.
OUT=${OUT:-/tmp/out}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=330 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -45
else
  BUDGET=60 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -3  # the wheels and gpu.txt only
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 200 python3 benchmarks/maintainers/s36/train_ab.py $OUT/train_ab.json 2>&1 | grep -v Warning | tail -4
timeout 60 python3 benchmarks/maintainers/kernel_lab.py --out $OUT/kernel_lab.json --only conv_shared,conv_bandwidth 2>&1 | grep -v Warning | tail -5
