#!/usr/bin/env bash
# The CUDA code on a GPU machine: build (unless prebuilt binaries run there), the CUDA tests,
# compute-sanitizer memcheck and racecheck on reduced cases, the stage benchmark, the grouped
# GEMM benchmark, the whole layer checked per preset; a short table last. Logs go to $OUT (or ./device-out).
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
#   MOEKIT_SANITIZE_FILTER='Cuda*:-CudaFp8Codec.*'   the tests compute-sanitizer runs (racecheck:
#   MOEKIT_RACECHECK_FILTER, default the same), each tool within MOEKIT_SANITIZE_TIMEOUT seconds
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

tests_status="not run"; memcheck_status="not run"; racecheck_status="not run"; bench_status="not run"
gemm_status="not run"; layer_status="not run"; decode_status="not run"
if [[ " $steps " == *" tests "* ]]; then
  echo "== test_cuda"
  timeout "${MOEKIT_TEST_TIMEOUT:-1200}" "$bin/tests/test_cuda" --gtest_color=no --gtest_filter="${MOEKIT_TEST_FILTER:-*}" 2>&1 | tee "$out/test_cuda.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^(routing|activation):|Failure|error" | head -n 60
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
if [[ " $steps " == *" sanitize "* ]] && command -v compute-sanitizer >/dev/null; then
  filter="${MOEKIT_SANITIZE_FILTER:-Cuda*:-CudaFp8Codec.*}"
  limit="${MOEKIT_SANITIZE_TIMEOUT:-1800}"  # seconds per tool; 124 = it ran out
  echo "== compute-sanitizer memcheck ($filter, small cases)"
  MOEKIT_CUDA_TEST_SMALL=1 timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/tests/test_cuda" --gtest_filter="$filter" \
    >"$logs/memcheck.log" 2>&1
  rc=$?; tail -n 4 "$logs/memcheck.log"; if [ $rc -eq 0 ]; then memcheck_status="pass"; else memcheck_status="FAIL ($rc)"; fi
  filter="${MOEKIT_RACECHECK_FILTER:-$filter}"
  echo "== compute-sanitizer racecheck ($filter)"
  MOEKIT_CUDA_TEST_SMALL=1 timeout "$limit" compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/tests/test_cuda" --gtest_filter="$filter" \
    >"$logs/racecheck.log" 2>&1
  rc=$?; tail -n 4 "$logs/racecheck.log"; if [ $rc -eq 0 ]; then racecheck_status="pass"; else racecheck_status="FAIL ($rc)"; fi
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
echo "tests: $tests_status | memcheck: $memcheck_status | racecheck: $racecheck_status | bench: $bench_status | gemm: $gemm_status | layer: $layer_status"
[ -f "$logs/bench.log" ] && grep "^|" "$logs/bench.log"
[ -f "$out/gemm.log" ] && cat "$out/gemm.log"
[ "$decode_status" != "FAIL" ] && [ "$tests_status" != "FAIL" ] && [ "$gemm_status" != "FAIL" ] && [ "$layer_status" != "FAIL" ] && [[ "$memcheck_status" != FAIL* ]] && [[ "$racecheck_status" != FAIL* ]] && [ "$bench_status" != "FAIL" ]
