#!/usr/bin/env bash
# Session 46, call 3 (any card): the tower GEMMs' orientation lab, then the 2b tower with its MLPs'
# fc1 transposed against the tower as landed (graphs, interleaved rounds).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 200 python3 benchmarks/maintainers/s46/gemm_orient.py "$OUT/gemm_orient.json" 2>&1 | tail -8
timeout 240 python3 benchmarks/maintainers/s46/tower_orient.py "$OUT/tower_orient.json" 2>&1 | tail -8
