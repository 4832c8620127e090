#!/usr/bin/env bash
# Session 36's device call (scratch, on the branch shared-conv; .whl carried), on a fresh machine:
# the standard suite from an empty cache (the fresh-suite measurement; its kernels recorded into
# the table's `compiled` list), the GPU tests, the table remade from that cache; then the labs
# conv_shared and conv_bandwidth (after the table, so their shapes stay out of it) and the
# whole-call A/B of the shared conv against main's two launches.
OUT=${OUT:-/tmp/out}
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=${BUDGET:-330} \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -60
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 90 python3 benchmarks/maintainers/kernel_lab.py --out $OUT/kernel_lab.json --only conv_shared,conv_bandwidth 2>&1 | grep -v Warning | tail -8
timeout 200 python3 benchmarks/maintainers/s36/conv_ab.py $OUT/conv_ab.json 2>&1 | grep -v Warning | tail -6
