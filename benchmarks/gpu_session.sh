#!/usr/bin/env bash
# One batched GPU session on the lent H200 (docs/gpu.md): install the carried fla wheels, then
# run what the environment asks for, everything written under $OUT.
#   TESTS='pytest -k expression' (or 'all', default none)   GPU tests of tests/test_ops_gpu.py
#   BACKBONE=1                                               benchmarks/backbone_forward.py on 2b
#   WORKLOADS='workloads/gpu/a.yaml ...'                     one dohnuts-bench run over them
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

if [ -n "${TESTS:-}" ]; then
  echo "== GPU tests ($TESTS)"
  sel=(); [ "$TESTS" != all ] && sel=(-k "$TESTS")
  timeout 400 python3 -m pytest -q tests/test_ops_gpu.py "${sel[@]}" -p no:cacheprovider --durations=10 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -25
fi
if [ -n "${BACKBONE:-}" ]; then
  echo "== backbone forward, qwen3.5-2b, 32 x 512"
  timeout 240 python3 benchmarks/backbone_forward.py --preset qwen3.5-2b --batch 32 --seq 512 \
    --out "$OUT/backbone_forward_2b.json" 2>&1 | tail -30
fi
if [ -n "${WORKLOADS:-}" ]; then
  echo "== dohnuts-bench run $WORKLOADS"
  # shellcheck disable=SC2086
  python3 -m dohnuts.bench.cli run $WORKLOADS --out /tmp/runs --label h200 --quiet 2>&1 \
    | tee "$OUT/bench_log.txt" | grep -v '^\s*$' | tail -40
  d=$(ls -d /tmp/runs/*/ | tail -1)
  cp "$d/results.jsonl" "$d/run.json" "$d/summary.json" "$d/report.txt" "$OUT/" 2>/dev/null
  cp "$d/roofline.png" "$OUT/" 2>/dev/null
fi
ls -la "$OUT"
