#!/usr/bin/env bash
# Session 46, call 5 (the last ≈ 240 device s), on branch tower-fc2-t: the tower A/B, then the tower's GPU tests.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 75 python3 benchmarks/maintainers/s46/tower_fc2_ab.py "$OUT/tower_fc2_ab.json" 2>&1 | tail -6
timeout -s INT 40 python3 -m pytest -q tests/gpu/test_ops.py tests/gpu/test_runtime.py -k "vision" -n 4 -p no:cacheprovider 2>&1 \
  | grep -E "passed|failed|^FAILED|^E " | tail -8
