#!/usr/bin/env bash
# Prefill on a GPU machine, in steps (issue #29's figures): the grouped GEMM kernels under
# compute-sanitizer, the grouped GEMM bench beside CUTLASS's tiles, `moekit tune` of the prefill
# buckets into a fresh cache and the layer bench of the shipped and the fresh cache side by side,
# `moekit run --check` of a preset's layer, and vLLM's GEMMs (../shared/peers/vllm, carried as
# .peers/vllm) on the same layer file beside `moekit bench --inputs`. A short table last.
#   MOEKIT_PREFILL_STEPS="sanitize gemm tune check peers"   (also: tests, the CUDA tests of MOEKIT_TEST_FILTER)
#   MOEKIT_PREFILL_PRESET=deepseek-v3   MOEKIT_PREFILL_TOKENS=512,1024,2048,4096,8192,16384
#   MOEKIT_PREFILL_ACCUMULATION=fast    --fp8-accumulation of the tune, check and bench steps
#   MOEKIT_GEMM_CASES=bench/cases/prefill.txt   the grouped GEMM bench's cases (from the root, or absolute)
#   MOEKIT_CHECK_TOKENS=512,4096        the checks' T (each saves its layer file and dump in /tmp), each
#                                       T or T:ACCUMULATION (that check's --fp8-accumulation)
#   MOEKIT_PEER_LAYER_T=4096            the layer file the peers step benches (made when absent)
#   MOEKIT_CHECK_CACHE=FILE             the tuning cache the check and the peers step's bench take
#   MOEKIT_BENCH_TILES=...              the grouped GEMM bench's tiles (its own filter)
#   carry: .cutlass .gtest (no registry there), .peers/vllm for the peers step
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
steps="${MOEKIT_PREFILL_STEPS:-sanitize gemm tune}"
preset="${MOEKIT_PREFILL_PRESET:-deepseek-v3}"
tokens="${MOEKIT_PREFILL_TOKENS:-512,1024,2048,4096,8192,16384}"
check_t="${MOEKIT_CHECK_TOKENS:-512,4096}"
accumulation=(--fp8-accumulation "${MOEKIT_PREFILL_ACCUMULATION:-fast}")
export PATH="/usr/local/cuda/bin:$PATH"
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}"
start=$SECONDS
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=ON \
      -DMOEKIT_GTEST_SOURCE="$root/.gtest" -DMOEKIT_CUTLASS_DIR="$root/.cutlass" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j 16 --target test_cuda grouped_gemm_bench moekit_cli >>"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 30
  echo "BUILD FAILED"
  exit 1
fi
echo "built in $((SECONDS - start)) s"
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
cli="$build/moekit"
status=0
summary=()

# The checks (their CPU reference takes minutes at T=4096) run beside the sanitizers, which time nothing.
check_pid=""
if [[ " $steps " == *" check "* ]]; then
  [ -f "${MOEKIT_CHECK_CACHE:-}" ] && export MOEKIT_TUNING_CACHE="$MOEKIT_CHECK_CACHE"
  (for spec in ${check_t//,/ }; do  # T, or T:ACCUMULATION
     t="${spec%%:*}"
     acc=("${accumulation[@]}")
     [[ "$spec" == *:* ]] && acc=(--fp8-accumulation "${spec#*:}")
     echo "== moekit run --preset $preset --tokens $t --backend cuda --check ${acc[*]}"
     timeout "${MOEKIT_CHECK_TIMEOUT:-300}" "$cli" run --preset "$preset" --tokens "$t" --backend cuda --check "${acc[@]}" \
       --save-layer "/tmp/layer_$t.safetensors" --dump "/tmp/dump_$t.safetensors" || echo "check T=$t: rc $?"
   done >"$out/check.log" 2>&1) &
  check_pid=$!
fi

if [[ " $steps " == *" tests "* ]]; then
  echo "== test_cuda ${MOEKIT_TEST_FILTER:-*persistent*:*Persistent*}"
  timeout "${MOEKIT_TEST_TIMEOUT:-300}" "$build/tests/test_cuda" --gtest_color=no \
    --gtest_filter="${MOEKIT_TEST_FILTER:-*persistent*:*Persistent*}" >"$out/tests.log" 2>&1 || status=1
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$out/tests.log" | head -n 30
  summary+=("tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/tests.log" | tr '\n' ' ')")
fi

if [[ " $steps " == *" sanitize "* ]]; then
  # Each tool over the grouped GEMM tests of moekit's own kernels, reduced shapes, all at once.
  filter="${MOEKIT_SANITIZE_FILTER:-*swapped*:*persistent*:*Persistent*:*Activated*}"
  pids=()
  for tool in memcheck racecheck synccheck; do
    (MOEKIT_CUDA_TEST_SMALL=1 timeout "${MOEKIT_SANITIZE_TIMEOUT:-200}" compute-sanitizer --tool "$tool" \
       --report-api-errors no --error-exitcode 3 "$build/tests/test_cuda" --gtest_color=no --gtest_filter="$filter" \
       >"$out/$tool.log" 2>&1; echo $? >"/tmp/$tool.rc") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for tool in memcheck racecheck synccheck; do
    rc=$(cat "/tmp/$tool.rc")
    [ "$rc" = 0 ] || status=1
    summary+=("$tool: rc $rc, $(grep -cE '^\[       OK' "$out/$tool.log") tests OK, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -n 1)")
  done
fi

if [ -n "$check_pid" ]; then
  wait "$check_pid"
  while read -r line; do summary+=("check: $line"); done < <(grep -E "^  tactic|PASS|FAIL|rc [0-9]" "$out/check.log" | cut -c1-160)
fi

if [[ " $steps " == *" gemm "* ]]; then
  cases="${MOEKIT_GEMM_CASES:-bench/cases/prefill.txt}"
  [[ "$cases" == /* ]] || cases="$root/$cases"
  echo "== grouped_gemm_bench --cases $cases"
  MOEKIT_BENCH_TILES="${MOEKIT_BENCH_TILES:-cooperative,ping-pong,128x128 persistent,128x192 persistent,W as A}" \
    timeout "${MOEKIT_BENCH_TIMEOUT:-240}" "$build/bench/grouped_gemm_bench" --cases "$cases" \
    >"$out/gemm.log" 2>&1 || status=1
  grep TFLOP "$out/gemm.log" | sed 's/ wgmma, f32 every 128 K//; s/ wgmma, f32 every 32 K/ k32/; s/ persistent wgmma (W as A), f32 every 128 K/ swapped/' | cut -c1-140
fi

if [[ " $steps " == *" tune "* ]]; then
  echo "== moekit tune --preset $preset --tokens $tokens"
  timeout "${MOEKIT_TUNE_TIMEOUT:-200}" "$cli" tune --preset "$preset" --tokens "$tokens" "${accumulation[@]}" --out "$out/tuned.json" \
    >"$out/tune.log" 2>"$out/tune.err" || status=1
  grep -E "changed|measurements" "$out/tune.log" | head -n 20
  echo "== moekit bench: shipped cache, fresh cache"
  timeout "${MOEKIT_LAYER_TIMEOUT:-150}" "$cli" bench --preset "$preset" --tokens "$tokens" "${accumulation[@]}" \
    --tuning-cache "$root/data/tuning/h200.json,$out/tuned.json" --json "$out/layer.json" >"$out/layer.log" 2>&1 || status=1
  tail -n 20 "$out/layer.log"
fi

if [[ " $steps " == *" peers "* ]]; then
  echo "== moekit bench --inputs (the preset's layer file) and vLLM's GEMMs on it"
  t="${MOEKIT_PEER_LAYER_T:-4096}"
  [ -f "/tmp/layer_$t.safetensors" ] || "$cli" run --preset "$preset" --tokens "$t" --backend cuda \
    --save-layer "/tmp/layer_$t.safetensors" --dump "/tmp/dump_$t.safetensors" >/dev/null 2>&1
  cache=()
  [ -f "${MOEKIT_CHECK_CACHE:-}" ] && cache=(--tuning-cache "$MOEKIT_CHECK_CACHE")
  timeout 150 "$cli" bench --inputs "/tmp/layer_$t.safetensors" --tokens "${MOEKIT_PEER_TOKENS:-512,4096}" "${cache[@]}" "${accumulation[@]}" \
    --json "$out/inputs.json" >"$out/inputs.log" 2>&1 || status=1
  tail -n 8 "$out/inputs.log"
  (cd "$root/.peers/vllm" && timeout "${MOEKIT_PEER_TIMEOUT:-200}" python3 bench_vllm.py --layer "/tmp/layer_$t.safetensors" \
     --dump "/tmp/dump_$t.safetensors" --tokens "${MOEKIT_PEER_TOKENS:-512,4096}" --no-ref --out "$out/vllm.json" \
     >"$out/vllm.log" 2>&1) || status=1
  tail -n 8 "$out/vllm.log"
fi

echo "== summary"
for line in "${summary[@]}"; do echo "$line"; done
exit $status
