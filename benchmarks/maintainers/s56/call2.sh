#!/usr/bin/env bash
# Session 56's prepared call 2 (scratch; not run), from a fresh machine on the early-tower commits,
# carry [".whl"]: the standard suite (first results and the 150-s check on a fresh cache), then on
# an H100 the comparison with M68's run (results/h100/2026-12-08-s55-suite).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
WORKLOADS='workloads/*.yaml' BUDGET=${SUITE_BUDGET:-400} bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD
run=$(ls -d /tmp/runs/*/ 2>/dev/null | tail -1)  # gpu_session.sh's run directory
if [ -n "$run" ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
  python3 -m dohnuts.bench.cli compare results/h100/2026-12-08-s55-suite "$run" --json "$OUT/compare_m68.json" \
    2>&1 | tail -40 | cut -c1-200
fi
echo "call done at $(($(date +%s) - START)) s"
