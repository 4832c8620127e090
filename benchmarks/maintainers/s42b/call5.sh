#!/usr/bin/env bash
# Session 42, call 5 (any GPU): rope_attn_lab.py (the tower's rotary inside its attention kernel).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 benchmarks/maintainers/s42b/rope_attn_lab.py "$OUT/rope_attn_lab.json" 2>&1 | grep -v "Warn\|Hopper" | tail -6
