#!/usr/bin/env bash
# Session 46, call 3 (any card): the tower GEMMs' orientation lab.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 240 python3 benchmarks/maintainers/s46/gemm_orient.py "$OUT/gemm_orient.json" 2>&1 | tail -20
