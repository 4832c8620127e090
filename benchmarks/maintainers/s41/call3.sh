#!/usr/bin/env bash
# Session 41, call 3. On an H200 (none lent since session 31): the table remade from an empty
# cache — the suite and text-4b with their kernels recorded (COMPILED_TABLE), the GPU tests after
# them, the tuned table from the cache (TUNE_TABLE). On an H100: the GPU training tests, then the
# three-way train-step A/B of the adapted groups' wide GEMM (lora_wide_ab.py).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=550 bash benchmarks/maintainers/gpu_session.sh
else
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
  export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
  timeout 150 python3 -m pytest -q -x tests/gpu/test_training.py -p no:cacheprovider 2>&1 | tail -3
  timeout 400 python3 benchmarks/maintainers/s41/lora_wide_ab.py "$OUT/lora_wide_ab.json" 2>&1 | tail -15
fi
