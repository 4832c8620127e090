#!/usr/bin/env bash
# Session 41, the first call that gets a machine. On an H200 (none lent since session 31): the
# table remade from an empty cache — the suite and text-4b with their kernels recorded
# (COMPILED_TABLE), the GPU tests after them, the tuned table from the cache (TUNE_TABLE). On an
# H100: the PDL lab (pdl_lab.py), nothing else.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=560 bash benchmarks/maintainers/gpu_session.sh
else
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/maintainers/s41/pdl_lab.py "$OUT/pdl_lab.json" 2>&1 | tail -12
fi
