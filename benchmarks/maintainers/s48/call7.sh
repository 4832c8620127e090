#!/usr/bin/env bash
# Session 48, call 7 (any card, a fresh machine), main with the conv backward's du in BF16: the GPU
# tests whole, the conv A/B again from an empty Triton cache (s48/conv_du_ab.py: four models, two of
# each), then train-step-2b through the harness.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -6
echo "tests done at $(($(date +%s) - START)) s"
timeout 200 python3 benchmarks/maintainers/s48/conv_du_ab.py "$OUT/conv_du_ab.json" 2>&1 | grep -v "^USDT" | tail -4
echo "A/B done at $(($(date +%s) - START)) s"
if [ $(($(date +%s) - START)) -lt 330 ]; then
  WORKLOADS='workloads/gpu/train-step-2b.yaml' BUDGET=150 bash benchmarks/maintainers/gpu_session.sh 2>&1 \
    | grep -E "train-step|all measured|efficien" | head -20
fi
