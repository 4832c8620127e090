#!/usr/bin/env bash
# Session 38's first call (scratch). An H200: the fresh suite from an empty cache, remaking its
# tuned table and compile list, with the GPU tests. Otherwise: per-kernel profiles of text-2b and
# train-step-2b (dohnuts alone) — the two missed targets without a current profile.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $name == *H200* ]]; then
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=560 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -40
else
  PROFILE_RUN=1 BUDGET=400 WORKLOADS='benchmarks/maintainers/s38/text-2b.yaml benchmarks/maintainers/s38/train-step-2b.yaml' \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -80
fi
