#!/usr/bin/env bash
# Session 42, call 2 (warm after call 1): static_ab.py (integer inputs in one copy against one each).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/maintainers/s42/static_ab.py "$OUT/static_ab.json" 2>&1 | grep -v "Warn\|Hopper" | tail -8
