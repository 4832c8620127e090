#!/usr/bin/env bash
# Session 44, call 1 (at 2d2a46f + this script): the landed unfilter's equality and warps sweep, the
# capture modes beside a busy worker thread, the GPU tests whole, the cold prepare A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site:$PWD
timeout 90 python3 benchmarks/maintainers/s44/unfilter_warps.py $OUT/unfilter_warps.json 2>&1 | tail -6
for m in global thread_local; do timeout 60 python3 benchmarks/maintainers/s44/capture_modes.py $m 2>&1 | grep -E "predict:|cannot be captured|Error" | cut -c1-300 | tee -a $OUT/capture_modes.txt; done
timeout -s INT -k 20 150 python3 -m pytest -q tests/gpu -n 8 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR' | cut -c1-300 | tail -12
timeout 120 python3 benchmarks/maintainers/s44/prepare_ab.py 2>&1 | tee $OUT/prepare_ab.txt | grep -E "round|prepare " | tail -20
