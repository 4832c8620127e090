#!/usr/bin/env bash
# Session 36's device call (scratch, on the branch shared-conv; .whl carried), on a fresh machine:
# the standard suite from an empty cache (the fresh-suite measurement) and the GPU tests — on an
# H200 also the table remade from that cache (its kernels recorded into `compiled`); then the
# shared conv's variants (32- against 64-bit row arithmetic, beside the two launches it replaces)
# and the whole-call A/B of the shared conv against main's two launches.
OUT=${OUT:-/tmp/out}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then export TUNE_TABLE=1 COMPILED_TABLE=1; fi
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=${BUDGET:-330} \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -60
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 90 python3 benchmarks/maintainers/s36/conv_variants.py $OUT/conv_variants.json 2>&1 | grep -v Warning | tail -4
timeout 200 python3 benchmarks/maintainers/s36/conv_ab.py $OUT/conv_ab.json 2>&1 | grep -v Warning | tail -6
