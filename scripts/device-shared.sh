#!/usr/bin/env bash
# DeepSeek-V3's shared expert fused into the layer (issue #31), on one GPU, in one call:
#   tests   test_cuda's shared-expert cases (CudaLayerShared*, the one-rank NCCL EP layer with a
#           shared expert) and the fuzz case 2296026896700209457 (CudaFuzzReplay)
#   check   moekit run --preset deepseek-v3 --shared-experts 1 --check at a few T
#   bench   moekit bench --preset deepseek-v3 --shared-experts 1: the fused layer against its two
#           parts run apart (the routed layer, then the shared expert alone), T = 1 ... 4096
# A short table last. Logs and JSON go to $OUT (or ./device-out).
#   MOEKIT_PREBUILT=DIR               DIR/moekit and DIR/tests/test_cuda (DIR/lib on the library path)
#   MOEKIT_SHARED_TESTS=shared|all|0  the shared-expert tests (default), the whole CUDA suite, none
#   MOEKIT_SHARED_CHECKS="4 64"       T of the --check runs (the CPU reference of deepseek-v3 at 64: ~1 min)
#   MOEKIT_SHARED_TOKENS=1,2,4,...,4096
set -uo pipefail
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
tests="${MOEKIT_SHARED_TESTS:-shared}"

if [ -n "${MOEKIT_PREBUILT:-}" ] && [ -x "$MOEKIT_PREBUILT/moekit" ]; then
  build="$MOEKIT_PREBUILT"
  [ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
  test_bin="$build/tests/test_cuda"
else
  build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}"
  args=(-DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS="$([ "$tests" = 0 ] && echo OFF || echo ON)")
  [ -f "$root/.cutlass/include/cutlass/cutlass.h" ] && args+=(-DMOEKIT_CUTLASS_DIR="$root/.cutlass")
  [ -f "$root/.gtest/CMakeLists.txt" ] && args+=(-DMOEKIT_GTEST_SOURCE="$root/.gtest")
  command -v ninja >/dev/null && args+=(-G Ninja)
  targets=(moekit_cli)
  [ "$tests" != 0 ] && targets+=(test_cuda)
  start=$(date +%s)
  if ! cmake -S "$root" -B "$build" "${args[@]}" >"$out/cmake.log" 2>&1 ||
     ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/cmake.log" "$out/build.log" 2>/dev/null
    echo "BUILD FAILED"
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  test_bin="$build/tests/test_cuda"
fi
cli="$build/moekit"
status=0

tests_line="not run"
if [ "$tests" != 0 ]; then
  filter='*Shared*:CudaFuzzReplay*:CudaEpNccl.OneRankEpLayerMatchesTheLocalLayer'
  [ "$tests" = all ] && filter='*'
  echo "== test_cuda --gtest_filter=$filter"
  "$test_bin" --gtest_filter="$filter" >"$out/test_cuda.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED) |^\[  SKIPPED \]|tests? from .* ran" "$out/test_cuda.log" | tail -n 30
  tests_line="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$out/test_cuda.log" | tr '\n' ' ')(exit $rc)"
  [ "$rc" = 0 ] || status=1
fi

echo "== moekit run --preset deepseek-v3 --shared-experts 1 --check"
checks=()
for t in ${MOEKIT_SHARED_CHECKS:-4 64}; do
  for routing in fused external; do
    line=$("$cli" run --preset deepseek-v3 --shared-experts 1 --tokens "$t" --routing "$routing" --backend cuda --check 2>&1 |
           tee "$out/check_T${t}_$routing.log" | grep -E "^check:|error" | tr '\n' ' ')
    echo "T=$t $routing: $line"
    checks+=("T=$t $routing: ${line:0:60}")
    [[ "$line" == *"check: PASS"* ]] || status=1
  done
done

echo "== moekit bench --preset deepseek-v3 --shared-experts 1"
tokens="${MOEKIT_SHARED_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096}"
if ! "$cli" bench --preset deepseek-v3 --shared-experts 1 --tokens "$tokens" --json "$out/bench_shared.json" \
     >"$out/bench_shared.log" 2>&1; then
  tail -n 5 "$out/bench_shared.log"
  status=1
fi
grep -E "^gpu:|^ceilings:" "$out/bench_shared.log"

echo
echo "== deepseek-v3 + 1 shared expert, fused vs run apart (us; CUDA graphs up to T=512)"
echo "tests: $tests_line"
for c in "${checks[@]}"; do echo "check $c"; done
python3 - "$out/bench_shared.json" <<'PY' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{'T':>5} {'fused':>9} {'routed':>9} {'shared':>9} {'apart':>9} {'fused/apart':>11} {'TFLOP/s':>8} {'eff%':>6}")
for c in r["cases"]:
    apart = c["routed_us"] + c["shared_us"]
    print(f"{c['tokens']:>5} {c['us']:>9.1f} {c['routed_us']:>9.1f} {c['shared_us']:>9.1f} {apart:>9.1f} "
          f"{c['us'] / apart:>11.3f} {c['tflops']:>8.1f} {100 * (c['efficiency'] or 0):>6.1f}")
PY
exit $status
