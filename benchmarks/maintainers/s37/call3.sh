#!/usr/bin/env bash
# Session 37's third call (scratch): the landed tower against the old (interleaved, one process),
# then the image workloads and the GPU tests on the tree.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 200 python3 benchmarks/maintainers/s37/tower_ab.py "$OUT/tower_ab.json" 2>&1 | tail -40
TESTS=all TEST_WORKERS=8 BUDGET=380 WORKLOADS='workloads/image-cache-cold.yaml workloads/image.yaml' \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | grep -E '^==|passed|failed|FAILED|Error|vision|tower|%|ms$' | head -60
