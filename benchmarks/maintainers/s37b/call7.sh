#!/usr/bin/env bash
# Session 37's seventh call (scratch): the tower's attention, SDPA against a Triton forward.
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD timeout 400 python3 benchmarks/maintainers/s37b/attn_lab.py "$OUT/attn_lab.json" 2>&1 | tail -20
