#!/usr/bin/env bash
# Session 56's prepared call 1 (scratch; not run: no device was lent), on the early-tower commits
# (on a branch: `git am benchmarks/maintainers/s56/early_tower.patch`), any CUDA card, carry
# [".whl"]: the GPU tests of the paths the early tower touches, then image-cache-cold-2b with the
# tower in the vision stage (`stage`, main's) and encoded early, taking turns 3 rounds, compared.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/ab"
START=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
grep -q _encode_early dohnuts/runtime/session.py || { echo "the early tower is not in this tree"; exit 1; }
echo "== GPU tests"
timeout -s INT -k 20 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_images_device.py \
  tests/gpu/test_runtime.py tests/gpu/test_training.py 2>&1 | tee "$OUT/gpu_tests.txt" \
  | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-200 | tail -20
for round in 1 2 3; do
  for v in stage early; do
    echo "== $v round $round at $(($(date +%s) - START)) s"
    timeout 120 python3 benchmarks/maintainers/s56/variant.py $v run benchmarks/maintainers/s56/cold-ab.yaml \
      --out "$OUT/ab/$v$round" --label "$v$round" --quiet 2>&1 | grep -v "^USDT" | tail -3 | cut -c1-300
  done
done
for round in 1 2 3; do
  python3 -m dohnuts.bench.cli compare "$OUT/ab/stage$round"/*/ "$OUT/ab/early$round"/*/ \
    --json "$OUT/ab/compare$round.json" 2>&1 | tail -25 | cut -c1-200
done
tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$OUT/ab"
echo "call done at $(($(date +%s) - START)) s"
