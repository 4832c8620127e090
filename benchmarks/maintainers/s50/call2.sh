#!/usr/bin/env bash
# Session 50, call 2 (any card; the table's remake, 400 s, no longer fits the session's device time):
# the runtime GPU tests, the preparation collated into its pinned buffer against bfde253's
# (s50/host_lab.py: text-2b, shared-prefix-2b, image-cache-warm-2b, call by call), then the suite
# on the tree (the vision trim, the collate, the results), all inside TOTAL seconds (default 400).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout -s INT 75 python3 -m pytest -q tests/gpu/test_runtime.py tests/gpu/test_images_device.py -n 8 -p no:cacheprovider -rfE 2>&1 \
  | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -4
echo "tests done at $(($(date +%s) - START)) s"
timeout 130 python3 benchmarks/maintainers/s50/host_lab.py "$OUT/host_lab_ab.json" workloads/gpu/text-2b.yaml \
  workloads/gpu/shared-prefix-2b.yaml workloads/gpu/image-cache-warm-2b.yaml 2>&1 | grep -v "^USDT" | tail -4 | cut -c1-2500
echo "lab done at $(($(date +%s) - START)) s"
WORKLOADS='workloads/*.yaml' BUDGET=$((${TOTAL:-400} - $(date +%s) + START)) OUT=$OUT/suite bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -30
echo "all done at $(($(date +%s) - START)) s"
