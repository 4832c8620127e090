#!/usr/bin/env bash
# Session 41, call 5 (any GPU): wide_parity.py (BF16 and FP32), then the GPU training and model tests.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 benchmarks/maintainers/s41/wide_parity.py "$OUT/wide_parity.json" 2>&1 | grep -v "Warn\|Hopper" | tail -45
timeout 150 python3 -m pytest -q tests/gpu/test_training.py tests/gpu/test_model.py -p no:cacheprovider -W ignore -rP 2>&1 | grep "train vs predict\|passed\|failed" | tail -4
