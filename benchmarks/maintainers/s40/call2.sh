#!/usr/bin/env bash
# Session 40, call 2 (any GPU): the host's cost of a graph replay's start (replay_cost.py).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache timeout 400 python3 benchmarks/maintainers/s40/replay_cost.py "$OUT/replay_cost.json" 2>&1 | tail -8
