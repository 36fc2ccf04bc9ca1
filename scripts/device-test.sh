#!/usr/bin/env bash
# The CUDA code on a GPU machine: build (unless prebuilt binaries run there), the CUDA tests,
# compute-sanitizer memcheck, racecheck and synccheck over the whole CUDA suite in reduced shapes,
# the stage benchmark, the grouped GEMM benchmark, the whole layer checked per preset; a short
# table last. Logs go to $OUT (or ./device-out).
#   scripts/device-test.sh                 build in /tmp/moekit-build, then run everything
#   MOEKIT_PREBUILT=DIR scripts/device-test.sh   use DIR/tests/test_cuda and DIR/bench/cuda_stages_bench
#   MOEKIT_STEPS="tests sanitize bench gemm layer decode ncu profile"  which steps (default: all but
#     ncu and profile: per-SASS-instruction execution counts of MOEKIT_PROFILE_KERNELS, as CSV in $OUT,
#     which scripts/sass_profile.py summarizes by opcode and region)
#   MOEKIT_TEST_FILTER='CudaRouting*'      the CUDA tests the tests step runs (default: all), within
#   MOEKIT_TEST_TIMEOUT seconds (default 1200; 124 = it ran out)
#   MOEKIT_BENCH_AB="a/cuda_stages_bench b/cuda_stages_bench"   more stage benches, run in turn after
#     the first (variants built elsewhere), each table printed under its path
#   MOEKIT_GEMM_ARGS=--decode              the grouped GEMM bench's cases (default: all; --masked, --decode)
#   MOEKIT_SANITIZE_TOOLS="memcheck racecheck synccheck"   the compute-sanitizer tools the sanitize step
#     runs, all at once, each over test_cuda with MOEKIT_CUDA_TEST_SMALL=1 (every test shrinks its
#     cases; the past-2-GiB test skips) and one summary line per shard (errors or hazards, tests, seconds)
#   MOEKIT_SANITIZE_SHARDS=1               gtest shards of the suite per tool, run in parallel
#   MOEKIT_SANITIZE_FILTER='*'             the tests each tool runs (default: all of test_cuda); per tool
#     MOEKIT_MEMCHECK_FILTER, MOEKIT_RACECHECK_FILTER, MOEKIT_SYNCCHECK_FILTER override it
#   MOEKIT_SANITIZE_TIMEOUT=180            seconds per tool (MOEKIT_<TOOL>_TIMEOUT per tool); a tool that
#     runs out is a failure that names the test it was in
# Full logs stay in $MOEKIT_LOG_DIR (default /tmp/moekit-device-logs); $OUT gets the few that
# matter (at most 8 files come back from a lent machine).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
logs="${MOEKIT_LOG_DIR:-/tmp/moekit-device-logs}"
mkdir -p "$logs"
steps="${MOEKIT_STEPS:-tests sanitize bench gemm layer decode}"
export PATH="/usr/local/cuda/bin:$PATH"
# A fresh seed per run for the tests' random data (fixed in CI), printed so that a failure replays
# with MOEKIT_TEST_SEED=N.
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv 2>&1

bin=""
[ -n "${MOEKIT_PREBUILT:-}" ] && [ -d "$MOEKIT_PREBUILT/lib" ] && export LD_LIBRARY_PATH="$MOEKIT_PREBUILT/lib:${LD_LIBRARY_PATH:-}"
if [ -n "${MOEKIT_PREBUILT:-}" ] && "$MOEKIT_PREBUILT/tests/test_cuda" --gtest_list_tests >/dev/null 2>&1; then
  bin="$MOEKIT_PREBUILT"
  echo "== using prebuilt binaries from $bin"
else
  build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}"
  gtest_args=()
  [ -f "$root/.gtest/CMakeLists.txt" ] && gtest_args=(-DMOEKIT_GTEST_SOURCE="$root/.gtest")
  [ -f "$root/.cutlass/include/cutlass/cutlass.h" ] && gtest_args+=(-DMOEKIT_CUTLASS_DIR="$root/.cutlass")
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  echo "== building in $build"
  start=$(date +%s)
  if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=ON "${gtest_args[@]}" \
        >"$logs/cmake.log" 2>&1 ||
     ! cmake --build "$build" -j 16 --target test_cuda cuda_stages_bench grouped_gemm_bench moekit_cli >"$logs/build.log" 2>&1; then
    tail -n 40 "$logs/cmake.log" "$logs/build.log" 2>/dev/null
    echo "BUILD FAILED"
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  bin="$build"
fi

tests_status="not run"; bench_status="not run"
declare -A sanitize_status=([memcheck]="not run" [racecheck]="not run" [synccheck]="not run")
gemm_status="not run"; layer_status="not run"; decode_status="not run"
if [[ " $steps " == *" tests "* ]]; then
  echo "== test_cuda"
  timeout "${MOEKIT_TEST_TIMEOUT:-1200}" "$bin/tests/test_cuda" --gtest_color=no --gtest_filter="${MOEKIT_TEST_FILTER:-*}" 2>&1 | tee "$out/test_cuda.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^(routing|activation|past-2GiB):|Failure|error" | head -n 60
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then tests_status="pass"; else tests_status="FAIL"; fi
fi
if [[ " $steps " == *" bench "* ]]; then
  echo "== cuda_stages_bench"
  timeout 300 "$bin/bench/cuda_stages_bench" >"$logs/bench.log" 2>&1
  if [ $? -eq 0 ]; then bench_status="ran"; else bench_status="FAIL"; fi
  grep -v "^|" "$logs/bench.log" | tail -n 20
  for other in ${MOEKIT_BENCH_AB:-}; do
    echo "== $other"
    timeout 300 "$other" 2>&1 | grep "^| [dq]" || bench_status="FAIL"
  done
fi

if [[ " $steps " == *" gemm "* ]]; then
  echo "== grouped_gemm_bench"
  if "$bin/bench/grouped_gemm_bench" ${MOEKIT_GEMM_ARGS:-} >"$out/gemm.log" 2>&1; then gemm_status="ran"; else gemm_status="FAIL"; fi
fi
if [[ " $steps " == *" layer "* ]]; then
  echo "== moekit run --backend cuda --check (every preset, its default quant and others)"
  layer_status="pass"
  : >"$out/layer.log"
  for run in ${MOEKIT_LAYER_RUNS:-"qwen3-30b-a3b:fp8-block:64" "qwen3-30b-a3b:bf16:64" "qwen3-30b-a3b:fp8-rowwise:64" \
      "qwen3-30b-a3b:fp8-tensor:64" "deepseek-v3:fp8-block:8" "qwen3-235b-a22b:fp8-block:8" "mixtral-8x7b:fp8-tensor:8" \
      "minimax-m2:fp8-block:8" "llama4-scout:fp8-rowwise:8" "gpt-oss-120b:bf16:8"}; do
    IFS=: read -r preset quant tokens <<<"$run"
    line=$("$bin/moekit" run --preset "$preset" --quant "$quant" --tokens "$tokens" --backend cuda --check 2>&1 |
           tee -a "$out/layer.log" | grep -E "^check:|forward|error" | tr '\n' ' ')
    echo "$preset $quant T=$tokens: $line"
    [[ "$line" == *"check: PASS"* ]] || layer_status="FAIL"
  done
fi
if [[ " $steps " == *" decode "* ]]; then
  echo "== moekit bench, decode and small T, per step"
  if "$bin/moekit" bench --preset qwen3-30b-a3b,deepseek-v3 --tokens "${MOEKIT_DECODE_TOKENS:-1,8,16,64}" --stages \
       --json "$out/decode.json" >"$out/decode.log" 2>"$logs/decode.err"; then decode_status="ran"; else decode_status="FAIL"; fi
  tail -n 3 "$logs/decode.err"
fi
# One line for a sanitizer log: the tool's error (racecheck: hazard) count, the tests that ran and
# failed, the time against the limit, the slowest tests; prints the status last: pass only with
# exit code 0 and a summary of 0 (a process that dies prints no summary).
sanitize_summary() {
  local label=$1 tool=$2 log=$3 rc=$4 seconds=$5 limit=$6 count="" ok failed slowest status
  if [ "$tool" = racecheck ]; then
    count=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)" "$log" | tail -n 1 |
            sed -E 's/RACECHECK SUMMARY: ([0-9]+) hazards? displayed \(([0-9]+) errors?, ([0-9]+) warnings?\)/\1 hazards (\2 errors, \3 warnings)/')
  fi
  [ -z "$count" ] && count=$(grep -oE "ERROR SUMMARY: [0-9]+ errors?" "$log" | tail -n 1 | sed -E 's/ERROR SUMMARY: ([0-9]+) errors?/\1 errors/')
  ok=$(grep -c "^\[       OK \]" "$log")
  failed=$(grep -oE "^\[  FAILED  \] [0-9]+ tests?, listed below" "$log" | grep -oE "[0-9]+" | head -n 1)
  slowest=$(grep -E "^\[       OK \] .* \([0-9]+ ms\)$" "$log" | sed -E 's/^\[       OK \] (.*) \(([0-9]+) ms\)$/\2 \1/' |
            sort -rn | head -n 3 | awk '{printf "%s%s %.1f s", (NR > 1 ? ", " : ""), $2, $1 / 1000}')
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status="FAIL (ran out of ${limit} s in $(grep -E '^\[ RUN      \]' "$log" | tail -n 1 | sed -E 's/^\[ RUN      \] //'))"
  elif [ -z "$count" ]; then
    status="FAIL (rc $rc, no summary: the process died)"
  elif [ "$rc" -ne 0 ] || [[ "$count" != 0\ * ]]; then
    status="FAIL (rc $rc)"
  else
    status="pass"
  fi
  echo "$label: $status | ${count:-no summary} | $ok tests passed, ${failed:-0} failed | ${seconds} s of ${limit} s | slowest: ${slowest:-none}" >>"$out/sanitize.log"
  echo "$status, ${count:-no summary}"
}

if [[ " $steps " == *" sanitize "* ]]; then
  # Every tool at once, each over MOEKIT_SANITIZE_SHARDS shards of the suite (gtest's sharding),
  # all in parallel on the one GPU. NCCL's own probing of kernel images (cudaFuncGetAttributes on
  # images for other GPUs) is an API error by design: API errors are not reported; moekit's
  # own CUDA calls are checked and fail their test.
  : >"$out/sanitize.log"
  shards="${MOEKIT_SANITIZE_SHARDS:-1}"
  tools="${MOEKIT_SANITIZE_TOOLS:-memcheck racecheck synccheck}"
  start=$(date +%s)
  for tool in $tools; do
    command -v compute-sanitizer >/dev/null || break
    upper=$(echo "$tool" | tr '[:lower:]' '[:upper:]')
    filter_var="MOEKIT_${upper}_FILTER" limit_var="MOEKIT_${upper}_TIMEOUT"
    filter="${!filter_var:-${MOEKIT_SANITIZE_FILTER:-*}}"
    limit="${!limit_var:-${MOEKIT_SANITIZE_TIMEOUT:-180}}"
    echo "== compute-sanitizer $tool ($filter, MOEKIT_CUDA_TEST_SMALL=1, $shards shards, ${limit} s)"
    for ((i = 0; i < shards; i++)); do
      ( MOEKIT_CUDA_TEST_SMALL=1 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout -k 10 "$limit" \
          compute-sanitizer --tool "$tool" --error-exitcode 9 --report-api-errors no \
          "$bin/tests/test_cuda" --gtest_color=no --gtest_filter="$filter" >"$logs/$tool.$i.log" 2>&1
        echo "$? $(( $(date +%s) - start ))" >"$logs/$tool.$i.rc" ) &
    done
  done
  wait
  for tool in $tools; do
    if ! command -v compute-sanitizer >/dev/null; then
      echo "$tool: FAIL (no compute-sanitizer on PATH)" | tee -a "$out/sanitize.log"
      sanitize_status[$tool]="FAIL (no compute-sanitizer)"
      continue
    fi
    upper=$(echo "$tool" | tr '[:lower:]' '[:upper:]')
    limit_var="MOEKIT_${upper}_TIMEOUT"
    limit="${!limit_var:-${MOEKIT_SANITIZE_TIMEOUT:-180}}"
    sanitize_status[$tool]="pass"
    for ((i = 0; i < shards; i++)); do
      read -r rc seconds <"$logs/$tool.$i.rc"
      status=$(sanitize_summary "$tool $((i + 1))/$shards" "$tool" "$logs/$tool.$i.log" "$rc" "$seconds" "$limit")
      [[ "$status" == pass* ]] || sanitize_status[$tool]="$status (shard $((i + 1))/$shards)"
      # What it reported, each report under the test that was running (or where it stopped), on
      # stdout too: a lent machine returns at most 8 files, and this must not be lost with one.
      grep -E "^\[ RUN      \]|^========= (Invalid|Race|Barrier|Error|Warning|Program hit|Hazard)|^\[  FAILED  \]" "$logs/$tool.$i.log" |
        grep -B1 -E "^=========|^\[  FAILED" | grep -v "^--$" | head -n 24 >>"$out/sanitize.log"
    done
  done
  cat "$out/sanitize.log"
fi
if [[ " $steps " == *" ncu "* ]] && command -v ncu >/dev/null; then
  # One ncu pass per kernel (its first launch, a warm-up of the bench), at the card's own clocks.
  for kernel in ${MOEKIT_NCU_KERNELS:-route_registers quantize_groups activate_groups finalize_tokens}; do
    echo "== ncu $kernel"
    ncu --clock-control none -k "regex:$kernel" -c 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
      "$bin/bench/cuda_stages_bench" >"$out/ncu_$kernel.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Active Warps|Registers Per|Warp Cycles Per Issued|Executed Ipc Active|Executed Instructions  " \
      "$out/ncu_$kernel.txt" | head -n 12
  done
fi

if [[ " $steps " == *" profile "* ]] && command -v ncu >/dev/null; then
  # Executed instructions per SASS line of the first launch whose mangled name matches.
  for kernel in ${MOEKIT_PROFILE_KERNELS:-route_registersIfLi8 quantize_groupsILb0ELi2 activate_groupsILNS1_4EmitE0ELNS_10ActivationE0E}; do
    echo "== profile $kernel"
    ncu --clock-control none --kernel-name-base mangled -k "regex:$kernel" -c 1 --section SourceCounters \
      --section InstructionStats --section SpeedOfLight -f -o "$logs/profile" "$bin/bench/cuda_stages_bench" >"$logs/profile.log" 2>&1
    ncu -i "$logs/profile.ncu-rep" --page source --csv --print-source sass >"$out/sass_$kernel.csv" 2>>"$logs/profile.log"
    ncu -i "$logs/profile.ncu-rep" --page details 2>&1 | grep -E "Duration|Executed Instructions  |DRAM Throughput" | head -n 4
  done
fi

echo
echo "== summary"
echo "test seed: MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
echo "tests: $tests_status | bench: $bench_status | gemm: $gemm_status | layer: $layer_status | decode: $decode_status"
for tool in memcheck racecheck synccheck; do echo "$tool: ${sanitize_status[$tool]}"; done
[ -f "$logs/bench.log" ] && grep "^|" "$logs/bench.log"
[ -f "$out/gemm.log" ] && cat "$out/gemm.log"
[ "$decode_status" != "FAIL" ] && [ "$tests_status" != "FAIL" ] && [ "$gemm_status" != "FAIL" ] && [ "$layer_status" != "FAIL" ] &&
  [[ "${sanitize_status[memcheck]}" != FAIL* ]] && [[ "${sanitize_status[racecheck]}" != FAIL* ]] &&
  [[ "${sanitize_status[synccheck]}" != FAIL* ]] && [ "$bench_status" != "FAIL" ]
