#!/usr/bin/env bash
# Session 39, call 3: the fresh suite on this session's code (GPU tests first, as M50/M51's runs).
WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=420 bash benchmarks/maintainers/gpu_session.sh
