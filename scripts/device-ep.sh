#!/usr/bin/env bash
# Expert parallelism on a GPU machine with several GPUs, in one call: build, the CUDA tests, then
#   identity  ep = N with the exact combine against one GPU on the same problem: the two --dump
#             files (out, topk_ids, topk_weights) compared byte for byte; --check printed too;
#   bench     mpirun -np N moekit bench --ep N (deepseek-v3, fp8-block) for each combine.
# One rank per GPU; NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Logs go to $OUT (or ./device-out).
#   MOEKIT_EP=N                      ranks (default: every GPU)
#   MOEKIT_EP_TESTS=0                skip building and running test_cuda
#   MOEKIT_PREBUILT=DIR              use DIR/moekit (and DIR/tests/test_cuda, DIR/lib) instead of a build
#   MOEKIT_EP_IDENTITY="deepseek-v3:256 qwen3-30b-a3b:256"   preset:tokens (the whole batch)
#   MOEKIT_EP_BENCH_TOKENS=128,4096  tokens per rank
set -uo pipefail
# A fresh seed per run for the tests' random data (fixed in CI), printed so that a failure replays
# with MOEKIT_TEST_SEED=N.
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
work="${MOEKIT_EP_WORK:-/tmp/moekit-ep}"
mkdir -p "$work"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n="${MOEKIT_EP:-$(nvidia-smi -L | wc -l)}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
nvidia-smi topo -m 2>&1 | head -n $((n + 2)) | tee "$out/topo.txt"

tests="${MOEKIT_EP_TESTS:-1}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
if [ -n "${MOEKIT_PREBUILT:-}" ] && [ -x "$MOEKIT_PREBUILT/moekit" ]; then
  # Prebuilt binaries (their lib/ on LD_LIBRARY_PATH, exported to the ranks by mpirun -x).
  # shellcheck source=scripts/device-cli.sh
  source "$root/scripts/device-cli.sh"
  find_cli "$root" "$out"
  build="$MOEKIT_PREBUILT"
  [ "$tests" = 1 ] && [ ! -x "$build/tests/test_cuda" ] && tests=0
else
  build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}"
  args=(-DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS="$([ "$tests" = 1 ] && echo ON || echo OFF)")
  [ -f "$root/.cutlass/include/cutlass/cutlass.h" ] && args+=(-DMOEKIT_CUTLASS_DIR="$root/.cutlass")
  [ -f "$root/.gtest/CMakeLists.txt" ] && args+=(-DMOEKIT_GTEST_SOURCE="$root/.gtest")
  command -v ninja >/dev/null && args+=(-G Ninja)
  targets=(moekit_cli)
  [ "$tests" = 1 ] && targets+=(test_cuda)
  start=$(date +%s)
  if ! cmake -S "$root" -B "$build" "${args[@]}" >"$out/cmake.log" 2>&1 ||
     ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/cmake.log" "$out/build.log" 2>/dev/null
    echo "BUILD FAILED"
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  cli="$build/moekit"
fi
mpi=(mpirun --allow-run-as-root -np "$n" -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1
     -x NVSHMEM_DISABLE_NVLS=1 -x LD_LIBRARY_PATH)

status=0
tests_status="not run"
if [ "$tests" = 1 ]; then
  echo "== test_cuda"
  if "$build/tests/test_cuda" --gtest_color=no >"$out/test_cuda.log" 2>&1; then tests_status="pass"; else tests_status="FAIL"; status=1; fi
  grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$out/test_cuda.log" | head -n 20
fi

identity=()
for run in ${MOEKIT_EP_IDENTITY:-deepseek-v3:256 qwen3-30b-a3b:256}; do
  IFS=: read -r preset tokens <<<"$run"
  problem=(run --preset "$preset" --tokens "$tokens" --backend cuda)
  echo "== $preset T=$tokens: one GPU, then ep=$n (exact combine)"
  "$cli" "${problem[@]}" --dump "$work/one.safetensors" >"$out/one_$preset.log" 2>&1 || status=1
  "${mpi[@]}" "$cli" "${problem[@]}" --ep "$n" --ep-combine exact --check --dump "$work/ep.safetensors" \
    >"$out/ep_$preset.log" 2>&1
  grep -E "forward|check:|bit-identical" "$out/ep_$preset.log"
  if cmp -s "$work/one.safetensors" "$work/ep.safetensors"; then verdict="same bytes"; else verdict="DIFFER"; status=1; fi
  identity+=("$preset T=$tokens ep=$n exact vs 1 GPU: $verdict")
  rm -f "$work/one.safetensors" "$work/ep.safetensors"
done

echo "== moekit bench --ep $n (partial and exact combine)"
"${mpi[@]}" "$cli" bench --ep "$n" --preset deepseek-v3 --tokens "${MOEKIT_EP_BENCH_TOKENS:-128,4096}" \
  --ep-combine partial,exact >"$out/bench_ep.log" 2>"$out/bench_ep.err" || status=1

echo
echo "== summary"
echo "test_cuda: $tests_status"
printf '%s\n' "${identity[@]}"
cat "$out/bench_ep.log"
tail -n 3 "$out/bench_ep.err"
exit $status
