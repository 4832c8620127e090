#!/usr/bin/env bash
# Session 44, call 2: the capture modes beside a thread preparing new images on the session (the
# product's own preparation), then the GPU runtime and training tests with the new capture tests.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
for m in global thread_local; do timeout 60 python3 benchmarks/maintainers/s44/capture_modes.py $m 2>&1 | grep -E "predict:|cannot be captured|Error" | cut -c1-300 | tee -a $OUT/capture_modes.txt; done
timeout -s INT -k 20 120 python3 -m pytest -q tests/gpu/test_runtime.py tests/gpu/test_training.py tests/gpu/test_images_device.py -n 6 -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.txt" | grep -E 'passed|failed|^FAILED|^ERROR|capture' | cut -c1-300 | tail -14
