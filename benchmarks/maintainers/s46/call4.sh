#!/usr/bin/env bash
# Session 46, call 4 (any card), on branch tower-fc2-t: the tower A/B (fc2 transposed against the
# blocks as before), the tower's and images' GPU tests, then image-cache-cold (the vision stage).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 150 python3 benchmarks/maintainers/s46/tower_fc2_ab.py "$OUT/tower_fc2_ab.json" 2>&1 | tail -8
WORKLOADS='workloads/image-cache-cold.yaml' TESTS='vision or tower or image or layer_norm or encode' TEST_WORKERS=8 BUDGET=150 \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -E "passed|failed|FAILED|ERROR|first result|all measured|vision|image-cache-cold" | tail -30
