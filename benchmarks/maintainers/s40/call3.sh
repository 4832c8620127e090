#!/usr/bin/env bash
# Session 40, call 3 (any GPU): what PDL saves at a kernel boundary inside a CUDA graph (pdl_lab.py).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/maintainers/s40/pdl_lab.py "$OUT/pdl_lab.json" 2>&1 | tail -12
