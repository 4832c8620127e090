#!/usr/bin/env bash
# Session 38's ninth call (scratch): the sources of a shared-prefix-2b call's small launches (`s38b/small_kernels.py`).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 250 python3 benchmarks/maintainers/s38b/small_kernels.py "$OUT/small_kernels.txt" 2>&1 | tail -60
