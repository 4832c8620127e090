#!/usr/bin/env bash
# Session 34, call 1 (any card): a fresh machine's first calls of shared-prefix-2b (is the varlen kkt_solve
# precompiled?), the GPU tests, the A/B of the shared delta rule, the launch lab, then M46's unfilter and
# cold-prepare checks.
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TESTS=all TEST_WORKERS=8 BUDGET=150 bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 200 python3 benchmarks/maintainers/s34/shared_ab.py $OUT/shared_ab.json 2>&1 | grep -v Warning | tail -70; echo "shared_ab rc $?"
timeout 100 python3 benchmarks/maintainers/s34/merge_lab.py $OUT/merge_lab.json 2>&1 | tail -60; echo "merge_lab rc $?"
timeout 60 python3 benchmarks/maintainers/unfilter_lab.py $OUT/unfilter_lab.json > $OUT/unfilter_lab.txt 2>&1; echo "unfilter_lab rc $?"
tail -20 $OUT/unfilter_lab.txt
timeout 100 python3 .gl/prepare_ab.py > $OUT/prepare_ab.txt 2>&1; echo "prepare_ab rc $?"
grep -E "round|prepare" $OUT/prepare_ab.txt | head -40
