#!/usr/bin/env bash
# Session 42, call 3 (any GPU): splitk_lab.py (the tower's GEMMs split along K).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/maintainers/s42/splitk_lab.py "$OUT/splitk_lab.json" 2>&1 | grep -v "Warn\|Hopper" | tail -12
