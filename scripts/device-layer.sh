#!/usr/bin/env bash
# The layer on a GPU machine, a build against a baseline in one call: `moekit bench` of both on the
# presets (synthetic weights and routing from the seed; the build with its per-step times), and
# `moekit run --check` of the build on deepseek-v3 at T = 4096; a short table last.
#   MOEKIT_NEW=DIR MOEKIT_BASE=DIR scripts/device-layer.sh    (DIR as for scripts/device-gemm.sh)
#   MOEKIT_LAYER_TOKENS=1,64,512,4096,16384   MOEKIT_BASE_FLAGS="--fp8-accumulation fast"
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
new="${MOEKIT_NEW:?MOEKIT_NEW=DIR}"
base="${MOEKIT_BASE:-}"
tokens="${MOEKIT_LAYER_TOKENS:-1,64,512,4096,16384}"
export LD_LIBRARY_PATH="$root/.prebuilt/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
status=0
echo "== $new/moekit bench --stages"
timeout 300 "$new/moekit" bench --preset deepseek-v3,qwen3-30b-a3b --tokens "$tokens" --stages \
  --json "$out/layer_new.json" >"$out/layer_new.log" 2>&1 || status=1
if [ -n "$base" ]; then
  echo "== $base/moekit bench ${MOEKIT_BASE_FLAGS:---fp8-accumulation fast}"
  # shellcheck disable=SC2086
  timeout 200 "$base/moekit" bench --preset deepseek-v3,qwen3-30b-a3b --tokens "$tokens" ${MOEKIT_BASE_FLAGS:---fp8-accumulation fast} \
    --json "$out/layer_base.json" >"$out/layer_base.log" 2>&1 || status=1
fi
echo "== $new/moekit run --preset deepseek-v3 --tokens 4096 --check"
timeout 200 "$new/moekit" run --preset deepseek-v3 --tokens 4096 --backend cuda --check >"$out/check.log" 2>&1 || status=1
echo "== summary"
grep -E "^check:|forward" "$out/check.log"
for f in "$out"/layer_new.log "$out"/layer_base.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
exit $status
