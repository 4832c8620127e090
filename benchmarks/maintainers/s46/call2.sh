#!/usr/bin/env bash
# Session 46, call 2 (any card): text-4b beside transformers at its best on one lease, at the code of
# call 1's suite (not measured since M53).
set -uo pipefail
WORKLOADS='workloads/gpu/text-4b.yaml' BUDGET=330 bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -60
