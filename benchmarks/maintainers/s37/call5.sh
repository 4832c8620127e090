#!/usr/bin/env bash
# Session 37's fifth call (scratch): the pixels through a 256-value table — the three-way tower A/B,
# the GPU tests, the cold image workload.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 240 python3 benchmarks/maintainers/s37/tower_ab.py "$OUT/tower_ab.json" 2>&1 | tail -50
TESTS=all TEST_WORKERS=8 BUDGET=300 WORKLOADS='workloads/image-cache-cold.yaml' \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | grep -E '^==|passed|failed|FAILED|Error|│ vision|efficiency \(crit' | head -40
