#!/usr/bin/env bash
# Session 41, call 4 (any GPU): train vs predict's score gap over seeded adapters, wide and not
# (train_predict_gap.py), then the GPU training tests on the code as landed.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/maintainers/s41/train_predict_gap.py "$OUT/train_predict_gap.json" 2>&1 | grep -v Warn | tail -14
timeout 200 python3 -m pytest -q tests/gpu/test_training.py tests/gpu/test_model.py -p no:cacheprovider -W ignore 2>&1 | tail -4
