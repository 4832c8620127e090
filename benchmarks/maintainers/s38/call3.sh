#!/usr/bin/env bash
# Session 38's third call (scratch): a probe for an H200. An H200: the fresh suite from an empty cache,
# remaking its tuned table and compile list, with the GPU tests (KI-20, KI-25). Anything else: nothing.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
if [[ $name == *H200* ]]; then
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=560 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -40
fi
