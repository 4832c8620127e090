#!/usr/bin/env bash
# Session 38's sixth call (scratch): the tower's Triton attention as landed — the GPU tests, the tower
# A/B against SDPA (`s38/tower_ab.py`), then the cold image workload (dohnuts alone) as measured.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/maintainers/s38/tower_ab.py "$OUT/tower_ab.json" 2>&1 | tail -5
TESTS=all TEST_WORKERS=8 BUDGET=420 WORKLOADS='benchmarks/maintainers/s38/image-cache-cold-2b.yaml' \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | grep -v '^\s*$' | tail -40
