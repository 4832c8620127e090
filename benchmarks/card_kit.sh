#!/usr/bin/env bash
# The run kit: the first result on a card in one command (README, "ROCm (AMD)"). On the machine
# with the card, from the repository root:
#
#   bash benchmarks/card_kit.sh                      # the RX 7900 XTX: HWSPEC=rx7900xtx by default
#
# 1. `dohnuts-bench calibrate` measures the card's ceilings — BF16 matmul as a burst and for 2 s back
#    to back (the sustained basis), FP32 multiply-adds, device copy, pinned host link: the
#    microbenchmarks every run takes at its start — and writes them into the `measured:` section
#    of a copy of the hwspec, $OUT/hwspecs/NAME.yaml (the datasheet numbers stay);
# 2. `dohnuts-bench run` runs the standard suite (or $WORKLOADS) against that copy and writes the
#    report (runs/bench/<run>/report.txt, summary.json, report.html).
# Vendor-neutral: any CUDA or ROCm GPU with its hwspec (HWSPEC=h200), and the CPU for a dry run.
#   HWSPEC   built-in name or path of the spec to copy (default rx7900xtx)
#   OUT      output folder (default runs, ignored by git): the copy in $OUT/hwspecs, the run in $OUT/bench
#   WORKLOADS  workload files (default: the standard suite)
#   PYTHON   the interpreter with dohnuts installed (default python3)
set -euo pipefail
HWSPEC=${HWSPEC:-rx7900xtx}
OUT=${OUT:-runs}
PYTHON=${PYTHON:-python3}
COPY="$OUT/hwspecs/$(basename "$HWSPEC" .yaml).yaml"
"$PYTHON" -m dohnuts.bench.cli calibrate --hwspec "$HWSPEC" --write "$COPY"
# shellcheck disable=SC2086 # WORKLOADS is a list of files
"$PYTHON" -m dohnuts.bench.cli run ${WORKLOADS:-} --hwspec "$COPY" --out "$OUT/bench" --label "$(basename "$COPY" .yaml)" \
  ${QUIET:+--quiet}
