#!/usr/bin/env bash
# Session 43, call 3: the unfilter variants' kernel times and equality, a cold prepare A/B, then the
# GPU image tests on the landed kernel (four rows a thread).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 benchmarks/maintainers/s43/unfilter_rows4.py $OUT/unfilter_rows4.json 2>&1 | tail -12
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_images_device.py 2>&1 | tail -3 | tee $OUT/gpu_images_tests.txt
timeout 100 python3 benchmarks/maintainers/s43/prepare_ab.py 2>&1 | tee $OUT/prepare_ab.txt | grep -v "^\s*$" | tail -40
