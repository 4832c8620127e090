#!/usr/bin/env bash
# Session 40, call 1: the image and shared-prefix workloads profiled (their kernels by class and a
# shared pass's kernels in order), then the LoRA lab (s39's, never run).
PROFILE_RUN=1 BUDGET=330 WORKLOADS='workloads/gpu/image-cache-warm-2b.yaml workloads/gpu/shared-prefix-2b.yaml workloads/gpu/image-cache-cold-2b.yaml' \
  bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD
for t in /tmp/runs/*/traces/*.json.gz; do
  echo "== $t"; python3 benchmarks/maintainers/s40/kernel_classes.py "$t"
  python3 -c "import sys; sys.argv=['x']; exec(open('benchmarks/maintainers/s40/kernel_classes.py').read().replace('if __name__', 'if False and __name__')); sequence('$t', 'dohnuts:shared', 90)"
done > "$OUT/kernel_classes.txt" 2>&1
head -c 3000 "$OUT/kernel_classes.txt"
TRITON_CACHE_DIR=$PWD/.triton_cache timeout 150 python3 benchmarks/maintainers/s40/lora_concat_lab.py "$OUT/lora_lab.json" 2>&1 | tail -12
