#!/usr/bin/env bash
# Session 37's first call (scratch): the tower lab; on an H200 also the conv's bandwidth lab.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
timeout 420 python3 benchmarks/maintainers/s37/tower_lab.py --out "$OUT" 2>&1 | tail -60
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 150 python3 benchmarks/maintainers/kernel_lab.py --only conv_bandwidth,conv_shared --out "$OUT/kernel_lab.json" 2>&1 | tail -30
fi
