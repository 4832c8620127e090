#!/usr/bin/env bash
# One batched GPU session on the lent H200 (see docs/gpu.md): install the carried fla wheels,
# run the GPU tests, the backbone forward comparison and the GPU workload set; everything under
# $OUT. Usage: benchmarks/gpu_session.sh [check|full]   (check: tests + one quick workload)
set -uo pipefail
MODE=${1:-check}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

echo "== GPU tests"
timeout 420 python3 -m pytest -q -x tests/test_ops_gpu.py -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"

echo "== backbone forward, qwen3.5-2b, 32 x 512"
timeout 300 python3 benchmarks/backbone_forward.py --preset qwen3.5-2b --batch 32 --seq 512 --out "$OUT/backbone_forward_2b.json" 2>&1 | tail -30

if [ "$MODE" = check ]; then
  echo "== quick workload"
  timeout 300 python3 -m dohnuts.bench.cli run workloads/gpu/text-2b.yaml --out /tmp/runs --quiet 2>&1 | tail -60
  cp /tmp/runs/*/results.jsonl "$OUT/check_results.jsonl" 2>/dev/null
else
  echo "== GPU workload set"
  timeout 1200 python3 -m dohnuts.bench.cli run workloads/gpu/*.yaml --out /tmp/runs --label h200 --quiet 2>&1 | tee "$OUT/bench_log.txt" | tail -150
  d=$(ls -d /tmp/runs/*/ | head -1)
  cp "$d/results.jsonl" "$d/run.json" "$d/summary.json" "$d/report.txt" "$OUT/" 2>/dev/null
  cp "$d/roofline.png" "$OUT/" 2>/dev/null
fi
ls -la "$OUT"
