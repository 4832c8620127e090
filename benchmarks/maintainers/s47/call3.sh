#!/usr/bin/env bash
# Session 47, call 4 (any card), on branch lora-bwd-wide: the train-step A/B (the wide groups'
# backward reading dy once, against main's), the GPU tests whole (the training parity tests among
# them), then train-step-2b through the harness beside its peers while time is left.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 130 python3 benchmarks/maintainers/s47/lora_bwd_ab.py "$OUT/lora_bwd_ab.json" 2>&1 | grep -v "^USDT" | tail -4
echo "A/B done at $(($(date +%s) - START)) s"
timeout -s INT 110 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-200 | tail -12
echo "tests done at $(($(date +%s) - START)) s"
if [ $(($(date +%s) - START)) -lt 150 ]; then
  WORKLOADS='workloads/gpu/train-step-2b.yaml' BUDGET=100 bash benchmarks/maintainers/gpu_session.sh 2>&1 \
    | grep -E "train-step|all measured" | head -30
fi
