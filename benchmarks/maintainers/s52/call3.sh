#!/usr/bin/env bash
# Session 52, call 3 (asked as nvidia-h200; any card): s52/collate_ab.py (the collate as landed
# against its from_numpy form, call by call) on shared-prefix-2b, image-cache-warm-2b and text-2b;
# then on an H200 the tuned table's remake, on any other card the suite with --profile.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1 timeout -s INT 170 \
  python3 benchmarks/maintainers/s52/collate_ab.py "$OUT/collate_ab.json" workloads/gpu/shared-prefix-2b.yaml \
  workloads/gpu/image-cache-warm-2b.yaml workloads/gpu/text-2b.yaml 2>&1 | grep -v "^USDT" | tail -4 | cut -c1-1500
echo "lab done at $(($(date +%s) - START)) s"
left=$((540 - $(date +%s) + START))
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=$left \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -25
else
  WORKLOADS='workloads/*.yaml' PROFILE_RUN=1 BUDGET=$left bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -25
fi
echo "all done at $(($(date +%s) - START)) s"
