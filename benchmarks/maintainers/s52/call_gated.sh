#!/usr/bin/env bash
# Session 52's prepared call (not run: no device time left), for the next session's first (any
# Hopper card), on branch cutlass-gated-s52 with .gl/libgated_gemm.so built on the CPU machine
# (s52/build_gated_gemm.sh) and carried: carry [".whl", ".gl"]. The lab (s52/gated_lab.py: six CUTLASS
# variants against cuBLAS + swiglu_packed and the s51 Triton kernel, ≈ 1 minute), then whole calls
# (s52/cutlass_ab.py) with the variant fastest at text-2b's shape, within TOTAL seconds (default 420).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
timeout -s INT 200 python3 benchmarks/maintainers/s52/gated_lab.py "$OUT/gated_lab.json" 2>&1 | grep -v "^USDT" | tail -8 | cut -c1-1500
echo "lab done at $(($(date +%s) - START)) s"
best=$(python3 -c "
import json, sys
d = json.load(open('$OUT/gated_lab.json'))['shapes']['2b-text']['medians_ms']
c = {k: v for k, v in d.items() if k.startswith('cutlass ')}
print(min(c, key=c.get) if c else '')" 2>/dev/null)
echo "fastest at 2b-text: ${best:-none}"
[ -z "$best" ] && exit 0
v=$(python3 -c "
import sys; sys.path.insert(0, 'benchmarks/maintainers/s52')
import gated_lab
print(gated_lab.variants(gated_lab.load())['${best#cutlass }'])")
timeout -s INT $((${TOTAL:-420} - $(date +%s) + START)) python3 benchmarks/maintainers/s52/cutlass_ab.py "$OUT/cutlass_ab.json" "$v" \
  workloads/gpu/text-2b.yaml workloads/gpu/shared-prefix-2b.yaml workloads/gpu/text-4b.yaml 2>&1 | grep -v "^USDT" \
  | tee "$OUT/cutlass_ab.log" | tail -5 | cut -c1-1500
echo "passes left eager (a failed capture): $(grep -c 'cannot be captured' "$OUT/cutlass_ab.log")"
echo "all done at $(($(date +%s) - START)) s"
