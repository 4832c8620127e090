#!/usr/bin/env bash
# Session 37's sixth call (scratch): the tower's GEMMs with and without their bias epilogue.
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/maintainers/s37/gemm_lab.py "$OUT/gemm_lab.json" 2>&1 | tail -20
