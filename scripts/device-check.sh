#!/usr/bin/env bash
# `moekit run --backend cuda --check` for every preset and every quant scheme its shapes allow, on
# a GPU machine, and the table of check lines (DESIGN §8's rule, docs/CHECK.md) last (issue #4's done-when).
#   scripts/device-check.sh                       build in /tmp/moekit-build (CUTLASS from .cutlass/)
#   MOEKIT_PREBUILT=DIR scripts/device-check.sh   use DIR/moekit (and DIR/lib on LD_LIBRARY_PATH)
#   MOEKIT_CHECK_TOKENS=64                        T of the matrix (default 64)
#   MOEKIT_CHECK_LARGE="deepseek-v3:fp8-block:4096"   extra preset:quant:T runs, first ("": none)
#   MOEKIT_CHECK_PRESETS="deepseek-v3 qwen3-30b-a3b"   the matrix's presets (default: all seven)
#   MOEKIT_CHECK_FLAGS="--fp8-accumulation exact"  extra flags for every FP8 run (fast is the default)
#   MOEKIT_CHECK_TIMEOUT=420                      seconds per run (the CPU reference is the cost)
# The full output of every run goes to $OUT/checks.log (or ./device-out). The whole matrix and the
# large run take longer than one 10-minute call: split them with the two variables above.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
tokens="${MOEKIT_CHECK_TOKENS:-64}"
limit="${MOEKIT_CHECK_TIMEOUT:-420}"
read -r -a flags <<<"${MOEKIT_CHECK_FLAGS:-}"

# shellcheck source=scripts/device-cli.sh
source "$root/scripts/device-cli.sh"
find_cli "$root" "$out"

# preset:quant:T, the large runs first; every preset with its default quant and the others its
# shapes allow (gpt-oss-120b: I % 128 != 0, no fp8-block).
read -r -a runs <<<"${MOEKIT_CHECK_LARGE-deepseek-v3:fp8-block:4096}"
read -r -a presets <<<"${MOEKIT_CHECK_PRESETS:-deepseek-v3 qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b minimax-m2 llama4-scout gpt-oss-120b}"
for preset in "${presets[@]}"; do
  for quant in fp8-block fp8-rowwise fp8-tensor bf16; do
    [ "$preset" = gpt-oss-120b ] && [ "$quant" = fp8-block ] && continue
    runs+=("$preset:$quant:$tokens")
  done
done

: >"$out/checks.log"
table=()
status=0
for run in "${runs[@]}"; do
  IFS=: read -r preset quant t <<<"$run"
  # bf16 layers take the default accumulation alone: drop --fp8-accumulation V for them.
  run_flags=()
  for ((i = 0; i < ${#flags[@]}; i++)); do
    if [ "$quant" = bf16 ] && [ "${flags[i]}" = --fp8-accumulation ]; then i=$((i + 1)); continue; fi
    run_flags+=("${flags[i]}")
  done
  start=$(date +%s)
  result=$(timeout "$limit" "$cli" run --preset "$preset" --quant "$quant" --tokens "$t" --backend cuda --check \
             "${run_flags[@]}" 2>&1 | tee -a "$out/checks.log" | grep -E "^check:|error:" | head -n 1 | cut -c1-160)
  [ -n "$result" ] || result="check: none (timed out after $limit s; see checks.log)"
  [[ "$result" == "check: PASS"* ]] || status=1
  line=$(printf "%-16s %-12s T=%-6s %4ss  %s" "$preset" "$quant" "$t" "$(( $(date +%s) - start ))" "$result")
  echo "$line"
  table+=("$line")
done
echo
echo "== summary ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null))"
printf "%s\n" "${table[@]}"
exit $status
