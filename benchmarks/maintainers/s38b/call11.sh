#!/usr/bin/env bash
# Session 38's eleventh call (scratch): the shared pass with cuBLASLt preferred against torch's default (`s38b/blas_lab.py`).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/maintainers/s38b/blas_lab.py "$OUT/blas_lab.json" 2>&1 | tail -40
