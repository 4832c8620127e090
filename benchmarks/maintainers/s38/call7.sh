#!/usr/bin/env bash
# Session 38's seventh call (scratch): the fresh standard suite on the tower's attention kernel, with the
# GPU tests after it (an H200, should one come: the same, and its table remade).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
extra=""; [[ $name == *H200* ]] && extra="TUNE_TABLE=1 COMPILED_TABLE=1"
env $extra WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=400 \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -40
