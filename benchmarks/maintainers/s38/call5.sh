#!/usr/bin/env bash
# Session 38's fifth call (scratch): the tower's attention as a Triton kernel inside the tower's graph,
# against SDPA (cuDNN) as landed, several tile configs (`s38/tower_attn_lab.py`).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD timeout 500 python3 benchmarks/maintainers/s38/tower_attn_lab.py "$OUT/tower_attn_lab.json" 2>&1 | tail -20
