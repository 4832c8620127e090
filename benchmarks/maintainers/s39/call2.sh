#!/usr/bin/env bash
# Session 39, call 2: text-4b profiled (dohnuts alone, graphs), its kernels by class.
PROFILE_RUN=1 BUDGET=480 WORKLOADS='benchmarks/maintainers/s39/text-4b.yaml' bash benchmarks/maintainers/gpu_session.sh
for t in /tmp/runs/*/traces/*.json.gz; do
  echo "== $t"; PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s39/kernel_classes.py "$t"
done 2>&1 | tee "$OUT/kernel_classes_4b.txt" | head -80
