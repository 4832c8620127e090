#!/usr/bin/env bash
# Session 50, call 1 (asked as nvidia-h200). On an H200: the tuned table remade from an empty cache
# (s49/call6.sh's run: the suite and text-4b with their kernels recorded, then the tuned and compiled
# tables). On an H100: the vision trim's A/B (s49/call9.sh: s49/vision_host.py, then the runtime and
# image GPU tests), the text-2b host lab (s50/host_lab.py) and the host preparation profiled.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=400 bash benchmarks/maintainers/gpu_session.sh
  exit
fi
bash benchmarks/maintainers/s49/call9.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/maintainers/s50/host_lab.py "$OUT/host_lab.json" 2>&1 | grep -v "^USDT" | tail -3 | cut -c1-3000
echo "host lab done at $(($(date +%s) - START)) s"
for w in workloads/gpu/text-2b.yaml workloads/gpu/shared-prefix-2b.yaml; do
  timeout 60 python3 benchmarks/maintainers/prepare_cost.py --workload "$w" --calls 200 --profile 30 2>&1 | grep -v '^\s*$'
done > "$OUT/host_prepare.txt"
grep "ms" "$OUT/host_prepare.txt" | grep -E "prepare|serialize" | head
echo "all done at $(($(date +%s) - START)) s"
