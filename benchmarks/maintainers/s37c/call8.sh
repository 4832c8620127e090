#!/usr/bin/env bash
# Session 37's eighth call (scratch): the next block's weights into L2 on a side stream.
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD timeout 300 python3 benchmarks/maintainers/s37c/prefetch_lab.py "$OUT/prefetch_lab.json" 2>&1 | tail -40
