#!/usr/bin/env bash
# The layer's kernels launched as programmatic dependents (src/cuda/common/dependent_launch.cuh) on
# a GPU machine, in one call: build (CUDA, 16 jobs), the CUDA tests of the kernels so launched, then
# `moekit bench` of the presets at small and middle T with MOEKIT_PDL=off and on, in turns (CUDA
# graphs, the shipped tuning cache). A short table last.
#   MOEKIT_PDL_PRESETS=qwen3-30b-a3b,deepseek-v3   MOEKIT_PDL_TOKENS=1,8,64,512
#   MOEKIT_PDL_ROUNDS=1              off/on pairs of bench runs
#   MOEKIT_TEST_FILTER=...           the CUDA tests run (default: the dependent kernels' and layers')
#   carry: .cutlass .gtest (no registry there)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}"
start=$SECONDS
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=ON \
      -DMOEKIT_GTEST_SOURCE="$root/.gtest" -DMOEKIT_CUTLASS_DIR="$root/.cutlass" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j 16 --target test_cuda moekit_cli >>"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 30
  echo "BUILD FAILED"
  exit 1
fi
echo "built in $((SECONDS - start)) s"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
status=0
filter="${MOEKIT_TEST_FILTER:-*DependentLaunch*:*CudaLayerGraph*:*CudaLayerMasked*:*CudaLayerMinLatency*:*CudaLayerFused*:*decode*:*Decode*:*CudaPermute*:*CudaRouting*:*CudaQuantize*:*CudaActivation*:*CudaFinalize*}"
echo "== test_cuda $filter"
timeout "${MOEKIT_TEST_TIMEOUT:-240}" "$build/tests/test_cuda" --gtest_color=no --gtest_filter="$filter" >"$out/tests.log" 2>&1 || status=1
grep -E "^\[  FAILED|Failure|Expected|Which is" "$out/tests.log" | head -n 30
grep -E "^\[  PASSED|^\[  FAILED  \] [0-9]+ test" "$out/tests.log"
presets="${MOEKIT_PDL_PRESETS:-qwen3-30b-a3b,deepseek-v3}"
tokens="${MOEKIT_PDL_TOKENS:-1,8,64,512}"
for round in $(seq 1 "${MOEKIT_PDL_ROUNDS:-1}"); do
  for mode in off on; do
    echo "== moekit bench MOEKIT_PDL=$mode (round $round)"
    MOEKIT_PDL=$mode timeout "${MOEKIT_BENCH_TIMEOUT:-150}" "$build/moekit" bench --preset "$presets" --tokens "$tokens" \
      --tuning-cache "$root/data/tuning/h200.json" --json "$out/pdl_${mode}_$round.json" >"$out/pdl_${mode}_$round.log" 2>&1 || status=1
  done
done
echo "== summary: us per layer call (CUDA graphs at T <= 512), kernels serial (off) and as dependents (on)"
python3 - "$out" <<'PY'
import glob, json, os, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "pdl_*.json"))):
    mode = os.path.basename(f).split("_")[1]
    for c in json.load(open(f))["cases"]:
        rows.setdefault((c["preset"], c["tokens"]), {}).setdefault(mode, []).append(c["us"])
print(f"{'preset':16} {'T':>5} {'off':>18} {'on':>18}")
for (preset, t), m in rows.items():
    fmt = lambda v: " ".join(f"{x:8.1f}" for x in v)
    print(f"{preset:16} {t:>5} {fmt(m.get('off', [])):>18} {fmt(m.get('on', [])):>18}")
PY
exit $status
