#!/usr/bin/env bash
# Session 38's second call (scratch): text-2b and text-4b beside transformers at its best (causal-conv1d
# carried) on one lease — text-4b has not run on an H100 — then the fused delta-rule kernel's configs
# at 2b's and 4b's shapes, each in its own process (`kernel_lab.py delta_configs`, KI-11).
WORKLOADS='workloads/gpu/text-2b.yaml workloads/gpu/text-4b.yaml' LAB=delta_configs BUDGET=560 \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\s*$' | tail -90
