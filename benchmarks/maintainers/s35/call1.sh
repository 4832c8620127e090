#!/usr/bin/env bash
# Session 35, call 1 (on the branch shared-delta-rule, a fresh machine): the standard suite first (fresh: issue
# 45's targets, the cold preparation on this host, the branch's shared pass), then the GPU tests, the shared
# A/B against HEAD's shared pass, the conv bandwidth lab (main's kernel_lab) — each within what is left.
OUT=${OUT:-/tmp/out}
START=$(date +%s); LIMIT=${LIMIT:-575}
left() { echo $((LIMIT - ($(date +%s) - START))); }
step() { local cap=$1; shift; local l=$(left); [ "$l" -lt 25 ] && { echo "skip: $*"; return; }; [ "$cap" -gt $((l - 10)) ] && cap=$((l - 10)); timeout $cap "$@"; echo "rc $? ($(left) s left): $*"; }
if [ "$LIMIT" -ge 470 ]; then  # the suite only where the branch's checks still fit after it
  WORKLOADS='workloads/*.yaml' BUDGET=$(( LIMIT - 230 < 275 ? LIMIT - 230 : 275 )) bash benchmarks/maintainers/gpu_session.sh 2>&1 | tail -75
else echo "no suite: LIMIT $LIMIT"; fi
echo "== after the suite: $(left) s left"
mkdir -p $OUT/t; OUT=$OUT/t TESTS=all TEST_WORKERS=8 BUDGET=$(( $(left) < 110 ? $(left) : 110 )) bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v "^gpu \|^name\|^NVIDIA\|^torch\|^triton cache\|^bytecode" | tail -30
echo "== after the tests: $(left) s left"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache
step 170 python3 benchmarks/maintainers/s34/shared_ab.py $OUT/shared_ab.json 2>&1 | grep -v Warning | tail -40
step 45 python3 .gl/kernel_lab_main.py --out $OUT/conv_bandwidth.json --only conv_bandwidth 2>&1 | tail -8
step 40 python3 .gl/conv_variants.py 2>&1 | tail -12
