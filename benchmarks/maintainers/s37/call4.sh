#!/usr/bin/env bash
# Session 37's fourth call (scratch): the fresh suite on the landed tower, with the GPU tests.
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=330 bash benchmarks/maintainers/gpu_session.sh 2>&1 \
  | grep -v '^\[gpu test\] passed' | tail -30
