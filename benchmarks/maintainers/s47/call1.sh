#!/usr/bin/env bash
# Session 47, call 1 (any card), on branch tower-fc2-t-s47 (s46's fc2_transposed.patch applied):
# the standard suite on a fresh machine with the GPU tests whole after it (gpu_session.sh), then the
# tower A/B (fc2 transposed against the blocks as before) and the language model's orientation lab.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=300 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -70
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 150 python3 benchmarks/maintainers/s47/tower_fc2_ab.py "$OUT/tower_fc2_ab.json" 2>&1 | tail -8
timeout 120 python3 benchmarks/maintainers/s47/lm_orient.py "$OUT/lm_orient.json" 2>&1 | tail -30
