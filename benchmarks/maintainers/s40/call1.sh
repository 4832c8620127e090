#!/usr/bin/env bash
# Session 40, call 1 (an H100): the image-cache-warm and shared-prefix workloads profiled (their
# kernels by class, a shared pass's kernels in order), text-4b beside its transformers peer on one
# lease (not profiled), then the LoRA lab (s39's, never run).
PROFILE_RUN=1 BUDGET=200 WORKLOADS='workloads/gpu/image-cache-warm-2b.yaml workloads/gpu/shared-prefix-2b.yaml' \
  bash benchmarks/maintainers/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
for t in /tmp/runs/*/traces/*dohnuts.json.gz; do
  echo "== $t"; python3 benchmarks/maintainers/s40/kernel_classes.py "$t"
  python3 -c "import sys; sys.argv=['x']; exec(open('benchmarks/maintainers/s40/kernel_classes.py').read().replace('if __name__', 'if False and __name__')); sequence('$t', 'dohnuts:shared', 90)"
done > "$OUT/kernel_classes.txt" 2>&1
head -c 2500 "$OUT/kernel_classes.txt"
timeout 150 python3 -m dohnuts.bench.cli run workloads/gpu/text-4b.yaml --out /tmp/runs4b --label h100 --quiet 2>&1 | tail -25
d=$(ls -d /tmp/runs4b/*/ | tail -1); tar czf "$OUT/text4b_run.tar.gz" -C "$d" run.json results.jsonl summary.json report.txt 2>/dev/null
timeout 120 python3 benchmarks/maintainers/s40/lora_concat_lab.py "$OUT/lora_lab.json" 2>&1 | tail -12
