#!/usr/bin/env bash
# Session 38's fourth call (scratch): image-cache-cold-2b, dohnuts alone, profiled as measured — the
# vision stage's single-call timeline (the idle before its first kernel, inside the tower's graph).
PROFILE_RUN=1 BUDGET=300 WORKLOADS='benchmarks/maintainers/s38/image-cache-cold-2b.yaml' \
  bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\s*$' | tail -30
