#!/usr/bin/env bash
# The grouped GEMMs on a GPU machine, a build against a baseline in one call: the grouped-GEMM
# tests of the build and `grouped_gemm_bench` of both; a short table last. Prebuilt binaries only
# (built here, sm_90a). The layer: scripts/device-layer.sh.
#   MOEKIT_NEW=DIR MOEKIT_BASE=DIR scripts/device-gemm.sh
#   DIR holds moekit, bench/grouped_gemm_bench (and for the build tests/test_cuda); .prebuilt/lib the
#   shared libraries the image lacks (Open MPI's)
#   MOEKIT_GEMM_STEPS="tests bench"   MOEKIT_GEMM_FILTER='*CudaGroupedGemm*'
#   MOEKIT_BENCH_NO_F16=1 (set here): the f16 (strict) tiles are left out of the bench
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
new="${MOEKIT_NEW:?MOEKIT_NEW=DIR}"
base="${MOEKIT_BASE:-}"
steps="${MOEKIT_GEMM_STEPS:-tests bench}"
export PATH="/usr/local/cuda/bin:$PATH"
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$root/.prebuilt/lib:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
status=0
if [[ " $steps " == *" tests "* ]]; then
  echo "== test_cuda ${MOEKIT_GEMM_FILTER:-*CudaGroupedGemm*}"
  timeout "${MOEKIT_TEST_TIMEOUT:-300}" "$new/tests/test_cuda" --gtest_color=no --gtest_filter="${MOEKIT_GEMM_FILTER:-*CudaGroupedGemm*}" \
    >"$out/tests.log" 2>&1 || status=1
  grep -E "^\[  FAILED|^\[  PASSED|Failure|error" "$out/tests.log" | head -n 40
fi
if [[ " $steps " == *" bench "* ]]; then
  for dir in $new $base; do
    echo "== $dir/grouped_gemm_bench"
    MOEKIT_BENCH_NO_F16=1 timeout 150 "$dir/bench/grouped_gemm_bench" >"$out/gemm_$(basename "$dir").log" 2>&1 || status=1
  done
fi
echo "== summary"
for f in "$out"/gemm_*.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "TFLOP|skipped" "$f" | cut -c1-170; }; done
exit $status
