#!/usr/bin/env bash
# Session 39, call 1: the GPU tests on the change, then the shared pass's A/B (shared_ab.py).
TESTS=all TEST_WORKERS=8 BUDGET=200 bash benchmarks/maintainers/gpu_session.sh
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 330 python3 benchmarks/maintainers/s39/shared_ab.py $OUT/shared_ab.json 2>&1 | tail -30
