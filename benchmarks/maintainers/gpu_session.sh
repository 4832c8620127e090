#!/usr/bin/env bash
# One batched GPU session (the lent H200, docs/gpu.md; any CUDA or ROCm GPU): install the carried
# fla wheels, then run what the environment asks for, everything written under $OUT. Vendor-neutral:
# the GPU is described by torch and by nvidia-smi / amd-smi / rocm-smi where one is installed.
#   WORKLOADS='workloads/gpu/a.yaml ...'                     one dohnuts-bench run over them (first)
#   TESTS='pytest -k expression' (or 'all', default none)   GPU tests of tests/gpu/
#   TEST_WORKERS=N (default 1)                               the tests in N processes (pytest-xdist, carried in .whl)
#   BACKBONE=1                                               benchmarks/maintainers/backbone_forward.py on 2b
#   PROFILE=1 (or 'B P S')                                   benchmarks/maintainers/profile_passes.py on 2b (32 × 448 + 64)
#   COLD=1                                                   benchmarks/maintainers/cold_start.py: 2 new processes
#   FIRST_CALLS='workloads/a.yaml ...'                       benchmarks/maintainers/first_calls.py, first of all (nothing
#                                                            cached yet): every compile, launcher build and autotune
#                                                            of one run of them, by thread → $OUT/first_calls.json
#   HOSTPROF='workloads/gpu/a.yaml ...'                      benchmarks/maintainers/prepare_cost.py --profile: host preparation
#   SCALING='workloads/scaling/a.yaml ...'                    one dohnuts-bench run of multi-process workloads
#   DISTKILL=1                                               NCCL: rank 1 of 2 killed in training, then --resume
#   BASELINES=N                                              this GPU's gate baseline: `dohnuts-bench baseline`,
#                                                            the standard suite N times back to back (one lease),
#                                                            → baselines.tar.gz (results/baselines/<machine id>/)
#   LAB='delta_ho,conv_parts'                               benchmarks/maintainers/kernel_lab.py experiments (kernel_lab.json)
#   PROFILE_RUN=1                                            the WORKLOADS run with --profile (summaries, traces under 4 MB in bench.tar.gz)
#   TUNE_TABLE=1                                             benchmarks/maintainers/tuned_table.py on the cache → $OUT/tuned_h200.json
#                                                            (start from an empty cache: carry no .triton_cache.tgz;
#                                                            the WORKLOADS then run before the TESTS)
#   COMPILED_TABLE=1                                         the WORKLOADS run records the kernels dohnuts compiles
#                                                            (benchmarks/maintainers/compiled_kernels.py) → $OUT/compiled_h200.json,
#                                                            the table with its `compiled` list (dohnuts/ops/_precompile.py)
#   PACK_CACHE=1                                             pack .triton_cache, trimmed, into $OUT (15 MB parts)
#                                                            (past 8 files in all, the loose ones go into logs.tar.gz)
#   BUDGET=seconds (default 540)                             stop starting new steps after this
#   LABEL=name (default: the GPU, e.g. h200, rx7900xtx)      run directory label of the benchmark runs
# Compiled Triton kernels and fla's autotuning choices persist in .triton_cache (TRITON_CACHE_DIR).
# The device returns at most 8 files: PACK_CACHE=1 packs the cache's binaries and metadata (all a
#   cache hit needs, docs/gpu.md) as 15 MB parts; cat triton_cache.tgz.* > .triton_cache.tgz here,
#   and the next call carries it (unpacked above).
set -uo pipefail
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-540}
START=$(date +%s)
mkdir -p "$OUT" .triton_cache
[ -f .triton_cache.tgz ] && tar xzf .triton_cache.tgz
BYTECODE=""
if ls .whl/*.whl >/dev/null 2>&1; then  # the carried wheels (docs/gpu.md); elsewhere: installed already
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  # The lent machine's image ships torch without bytecode and sets PYTHONDONTWRITEBYTECODE, so every
  # process compiled torch's sources again (10 s a process, docs/history/evolution.md M43). A pip
  # install writes the bytecode at install time; this is that step, once a machine (an up-to-date
  # file is skipped). Python reads bytecode under PYTHONDONTWRITEBYTECODE; it only writes none.
  t=$(date +%s)
  python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1
  BYTECODE="bytecode of the machine's packages compiled in $(($(date +%s) - t)) s (before the clock of any run)"
fi
# NCCL_NVLS_ENABLE: NVLink multicast off on NVIDIA (docs/gpu.md); RCCL ignores it.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton_cache NCCL_NVLS_ENABLE=0
left() { echo $((BUDGET - ($(date +%s) - START))); }
# The GPU, as torch sees it (any vendor), then the vendor's own tool where one is installed.
python3 -c "
import torch
p = torch.cuda.get_device_properties(0)
print('gpu', p.name, '| arch', getattr(p, 'gcnArchName', None) or f'sm_{p.major}{p.minor}',
      '| memory', round(p.total_memory / 2**30, 1), 'GiB | units', p.multi_processor_count,
      '| cuda', torch.version.cuda, '| hip', torch.version.hip)" | tee "$OUT/gpu.txt"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/gpu.txt"
elif command -v amd-smi >/dev/null; then
  amd-smi static --asic --driver --limit 2>/dev/null | tee -a "$OUT/gpu.txt"
elif command -v rocm-smi >/dev/null; then
  rocm-smi --showproductname --showdriverversion --showmaxpower 2>/dev/null | tee -a "$OUT/gpu.txt"
fi
LABEL=${LABEL:-$(python3 -c "
import re, torch
n = torch.cuda.get_device_name(0).lower()
print(next((k for k in ('h200', 'h100', 'a100', 'mi300', '7900') if k in n), re.sub('[^a-z0-9]+', '-', n).strip('-')).replace('7900', 'rx7900xtx'))")}
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
[ -n "$BYTECODE" ] && echo "$BYTECODE" | tee -a "$OUT/gpu.txt"
echo "triton cache at start: $(du -sh .triton_cache | cut -f1), $(find .triton_cache -name '*.autotune.json' | wc -l) autotune entries" | tee -a "$OUT/gpu.txt"

if [ -n "${FIRST_CALLS:-}" ] && [ "$(left)" -gt 60 ]; then  # first: it needs a machine that has compiled nothing
  echo "== first calls: $FIRST_CALLS ($(left) s left)"
  # shellcheck disable=SC2086
  timeout $(($(left) - 30)) python3 benchmarks/maintainers/first_calls.py "$OUT/first_calls.json" -- run $FIRST_CALLS \
    --out /tmp/first_calls_runs --label "$LABEL-first-calls" --quiet 2>&1 | tail -40
fi

# The GPU tests: before the workloads, except in a table-making run (TUNE_TABLE): many of fla's
# autotuners key a kernel by head counts and sizes only, so the first launch's shape picks its
# config for every shape; the workloads' shapes must come first (docs/history/evolution.md M29).
run_tests() {
  if [ -n "${TESTS:-}" ] && [ "$(left)" -gt 60 ]; then
    echo "== GPU tests ($TESTS, $(left) s left)"
    sel=(); [ "$TESTS" != all ] && sel=(-k "$TESTS")
    [ "${TEST_WORKERS:-1}" -gt 1 ] && sel+=(-n "$TEST_WORKERS")
    # SIGINT, not SIGTERM: pytest in Python code still prints its summary. Interrupted inside a compile
    # it prints none (M26), so each test also says its outcome and seconds as it ends (tests/gpu/conftest.py).
    timeout -s INT -k 20 $(($(left) - 30)) python3 -m pytest -q tests/gpu "${sel[@]}" -p no:cacheprovider --durations=10 -rfEP 2>&1 \
      | tee "$OUT/gpu_tests.txt" | grep -E '^\[gpu test\]|passed|failed|^FAILED|^ERROR' | cut -c1-220 | tail -60
  fi
}
[ -z "${TUNE_TABLE:-}" ] && run_tests
if [ -n "${WORKLOADS:-}" ] && [ "$(left)" -gt 60 ]; then
  echo "== dohnuts-bench run $WORKLOADS ($(left) s left)"
  # shellcheck disable=SC2086
  prof=(); [ -n "${PROFILE_RUN:-}" ] && prof=(--profile)
  bench=(python3 -m dohnuts.bench.cli)  # COMPILED_TABLE: the same run, its kernels recorded into the table
  [ -n "${COMPILED_TABLE:-}" ] && bench=(python3 benchmarks/maintainers/compiled_kernels.py "dohnuts/ops/tuned/$LABEL.json"
                                       "$OUT/compiled_$LABEL.json" --)
  rm -rf /tmp/runs; timeout $(($(left) - 30)) "${bench[@]}" run $WORKLOADS "${prof[@]}" --out /tmp/runs --label "$LABEL" --quiet \
    2>&1 | tee /tmp/bench_log.txt | grep -v '^\s*$' | tail -60
  d=$(ls -d /tmp/runs/*/ | tail -1)
  # a warm machine keeps /tmp: an earlier call's traces once went into this archive, too big to return
  rm -rf /tmp/bench_out; mkdir -p /tmp/bench_out && cp "$d/results.jsonl" "$d/run.json" "$d/summary.json" "$d/report.txt" \
    "$d/report.html" /tmp/bench_log.txt /tmp/bench_out/ 2>/dev/null
  if [ -d "$d/traces" ]; then
    # every summary (*.ops.txt), but only the Chrome traces under 4 MB: a file over 16 MiB does not
    # come back, and the profiled train-step's traces made the archive 29.6 MB (M43); the rest are listed
    # (a launched run's traces sit in subfolders: <workload>-p<N>/<target>/rank<R>.json.gz)
    mkdir -p /tmp/bench_out/traces
    (cd "$d" && find traces -type f -size -4000001c -print0 | xargs -0 -r cp --parents -t /tmp/bench_out/)
    (cd "$d" && find traces -type f -size +4000000c -printf '%p %s bytes\n') > /tmp/bench_out/traces/left_out.txt
    for t in "$d"/traces/*.ops.txt; do
      echo "== $(basename "$t")"; head -16 "$t" | cut -c1-200; grep -A4 '^[a-z(].*: [0-9.]* ms$' "$t" | cut -c1-160
    done
  fi
  tar czf "$OUT/bench.tar.gz" -C /tmp bench_out  # one file: a call returns at most 8
fi
[ -n "${TUNE_TABLE:-}" ] && run_tests
if [ -n "${SCALING:-}" ] && [ "$(left)" -gt 90 ]; then
  echo "== scaling: dohnuts-bench run $SCALING ($(left) s left)"
  # shellcheck disable=SC2086
  timeout $(($(left) - 30)) python3 -m dohnuts.bench.cli run $SCALING --out /tmp/scaling --label "$LABEL-scaling" --quiet 2>&1 \
    | tee /tmp/scaling_log.txt | grep -v '^\s*$' | tail -45
  d=$(ls -d /tmp/scaling/*/ | tail -1)
  mkdir -p /tmp/scaling_out && cp "$d/results.jsonl" "$d/run.json" "$d/summary.json" "$d/report.txt" \
    "$d/scaling.png" /tmp/scaling_log.txt /tmp/scaling_out/ 2>/dev/null
  cp "$d"/ranks/*/torchrun.log /tmp/scaling_out/ 2>/dev/null
  tar czf "$OUT/scaling.tar.gz" -C /tmp scaling_out  # one file: a call returns at most 8
fi
if [ -n "${DISTKILL:-}" ] && [ "$(left)" -gt 120 ]; then
  echo "== NCCL: rank 1 of 2 killed after update 3 of a 0.8b training run, then resumed ($(left) s left)"
  rm -rf /tmp/killrun
  { timeout 240 python3 -m tests.faulty_cli 1 3 train --model qwen3.5-0.8b --out /tmp/killrun \
      --updates 6 --eval-every 2 --synthetic-train 48 --nproc-per-node 2 2>&1 | tail -4; echo "train exit: ${PIPESTATUS[0]}"
    ls /tmp/killrun/checkpoints; echo "latest: $(cat /tmp/killrun/checkpoints/latest 2>/dev/null)"
    timeout 240 python3 -m dohnuts train --out /tmp/killrun --resume --nproc-per-node 2 2>&1 | tail -3
    echo "resume exit: ${PIPESTATUS[0]}"; ls /tmp/killrun/checkpoints; } 2>&1 | tee "$OUT/distkill.txt"
fi
if [ -n "${BASELINES:-}" ] && [ "$(left)" -gt 90 ]; then
  # a fresh H200 takes 120-220 s a suite (docs/history/evolution.md M30, M32): 2 runs fit one call
  echo "== gate baseline: the standard suite, $BASELINES runs ($(left) s left)"
  rm -rf /tmp/baselines
  timeout $(($(left) - 20)) python3 -m dohnuts.bench.cli baseline --runs "$BASELINES" --every 0 --into /tmp/baselines \
    --quiet 2>&1 | tail -40
  tar czf "$OUT/baselines.tar.gz" -C /tmp baselines
fi
if [ -n "${BACKBONE:-}" ] && [ "$(left)" -gt 60 ]; then
  echo "== backbone forward, qwen3.5-2b, 32 x 512"
  timeout $(($(left) - 20)) python3 benchmarks/maintainers/backbone_forward.py --preset qwen3.5-2b --batch 32 --seq 512 \
    --out "$OUT/backbone_forward_2b.json" 2>&1 | tail -30
fi
if [ -n "${PROFILE:-}" ] && [ "$(left)" -gt 60 ]; then
  echo "== pass profile, qwen3.5-2b"
  mkdir -p /tmp/profile
  shape=(32 448 64); [ "$PROFILE" != 1 ] && read -r -a shape <<< "$PROFILE"  # PROFILE='B P S'
  timeout $(($(left) - 20)) python3 benchmarks/maintainers/profile_passes.py --preset qwen3.5-2b --batch "${shape[0]}" \
    --prefix "${shape[1]}" --suffix "${shape[2]}" --out /tmp/profile 2>&1 | tail -12
  tar czf "$OUT/profile.tar.gz" -C /tmp profile  # one file: a call returns at most 8
fi
if [ -n "${HOSTPROF:-}" ] && [ "$(left)" -gt 45 ]; then
  echo "== host preparation, profiled ($(left) s left)"
  for w in $HOSTPROF; do
    timeout 60 python3 benchmarks/maintainers/prepare_cost.py --workload "$w" --calls 200 --profile 30 2>&1 | grep -v '^\s*$'
  done > "$OUT/host_prepare.txt"
  grep "prepare .* ms" "$OUT/host_prepare.txt"
fi
if [ -n "${LAB:-}" ] && [ "$(left)" -gt 45 ]; then
  echo "== kernel lab: $LAB ($(left) s left)"
  timeout $(($(left) - 20)) python3 benchmarks/maintainers/kernel_lab.py --only "$LAB" --out "$OUT/kernel_lab.json" 2>&1 \
    | tee "$OUT/kernel_lab.txt" | grep -v '^\s*$' | tail -40
fi
if [ -n "${COLD:-}" ] && [ "$(left)" -gt 60 ]; then
  echo "== time to first result of new processes ($(left) s left)"
  timeout $(($(left) - 10)) python3 benchmarks/maintainers/cold_start.py --model qwen3.5-2b --questions 32 --seq 512 --runs 2 \
    --out "$OUT/cold_start.json" 2>&1 | tail -4
fi
if [ -n "${TUNE_TABLE:-}" ]; then
  echo "== tuned-configuration table from the cache"
  python3 benchmarks/maintainers/tuned_table.py .triton_cache "$OUT/tuned_h200.json" 2>&1 | tail -3
fi
echo "triton cache at end: $(du -sh .triton_cache | cut -f1), $(find .triton_cache -name '*.autotune.json' | wc -l) autotune entries" | tee -a "$OUT/gpu.txt"
# Only binaries and metadata are needed for cache hits (docs/gpu.md): the trimmed archive is what
# comes back (as 15 MB parts; here: cat triton_cache.tgz.* > .triton_cache.tgz, carried next call).
# torch.compile's kernels (triton_*, from kernel_lab's inductor experiments) are left out: the
# runtime never compiles, and the archive plus the tracked tree must fit the 64 MiB carry limit
# (an archive with them, 48 MB, did not: 2026-12-01).
if [ -n "${PACK_CACHE:-}" ]; then
  find .triton_cache -type f \( -name '*.cubin' -o -name '*.json' -o -name '*.so' \) \
    ! -name 'triton_*' ! -name '__grp__triton_*' | tar czf - -T - | split -b 15m - "$OUT/triton_cache.tgz."
  size=$(cat "$OUT"/triton_cache.tgz.* | wc -c)
  echo "cache archive: $size bytes" | tee -a "$OUT/gpu.txt"
  # the carry limit counts the tracked tree (≈ 20 MB) too; stale entries are pruned by hand (docs/gpu.md)
  [ "$size" -gt 40000000 ] && echo "warning: a cache archive over 40 MB may not fit the 64 MiB carry limit" \
    | tee -a "$OUT/gpu.txt"
fi
# A call returns at most 8 files (the rest is lost: twice a cache part, 2026-12-01). Past 8, the
# loose files (gpu.txt, gpu_tests.txt, kernel_lab.*, cold_start.json, ...) go into one logs.tar.gz.
bundle_loose() {
  local n loose
  n=$(find "$1" -maxdepth 1 -type f | wc -l)
  [ "$n" -le 8 ] && return 0
  loose=$(cd "$1" && find . -maxdepth 1 -type f ! -name '*.tar.gz' ! -name 'triton_cache.tgz.*' -printf '%P\n' | sort)
  [ -z "$loose" ] && return 0
  (cd "$1" && tar czf logs.tar.gz $loose && rm -f $loose)  # names without spaces: ours
  n=$(find "$1" -maxdepth 1 -type f | wc -l)
  [ "$n" -gt 8 ] && echo "warning: $n files in \$OUT, a call returns 8: some will not come back" >&2
  return 0
}
bundle_loose "$OUT"
ls -la "$OUT"
