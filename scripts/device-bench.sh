#!/usr/bin/env bash
# moekit against the peers on a GPU machine, in one call: build (unless MOEKIT_PREBUILT has the
# CLI), then per preset write one layer file (weights + T_max tokens, `moekit run --save-layer`)
# and moekit's output on it, time moekit on its rows (`moekit bench --inputs ... --stages`, the
# default fast accumulation; again with --fp8-accumulation exact, into the log), run
# the PyTorch peers on the same file (bench/peers/moe_peers.py, each checked against moekit's
# output), and print one table: case, moekit µs, each peer's µs, speedup, roofline efficiency.
# Results go to $OUT (or ./device-out): moekit_<preset>.json, peers_<preset>.json, bench.png,
# table.md and device-bench.log (the tails of every step's log); the full logs stay in
# $MOEKIT_BENCH_WORK/logs (at most 8 files come back from a lent machine).
#   MOEKIT_BENCH_PRESETS="qwen3-30b-a3b deepseek-v3"   which presets (default both)
#   MOEKIT_BENCH_TOKENS=1,8,64,512,4096,16384           which T (the layer file holds the largest)
#   MOEKIT_GIT_COMMIT=<sha>                             recorded in the JSON when there is no .git
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
presets="${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b deepseek-v3}"
tokens="${MOEKIT_BENCH_TOKENS:-1,8,64,512,4096,16384}"
max_tokens=$(tr ',' '\n' <<<"$tokens" | sort -n | tail -n 1)
work="${MOEKIT_BENCH_WORK:-/tmp/moekit-bench}"
logs="$work/logs"
mkdir -p "$logs"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1

# shellcheck source=scripts/device-cli.sh
source "$root/scripts/device-cli.sh"
find_cli "$root" "$logs"

status=0
moekit_json=(); peer_json=()
for preset in $presets; do
  layer="$work/$preset.safetensors"
  echo "== $preset: layer file with $max_tokens tokens, moekit's output on it"
  start=$(date +%s)
  if ! "$cli" run --preset "$preset" --tokens "$max_tokens" --backend cuda --save-layer "$layer" \
       --dump "$work/$preset.out.safetensors" >"$logs/run_$preset.log" 2>&1; then
    tail -n 20 "$logs/run_$preset.log"; status=1; continue
  fi
  echo "   written in $(( $(date +%s) - start )) s"
  echo "== $preset: moekit bench"
  if "$cli" bench --inputs "$layer" --name "$preset" --tokens "$tokens" --stages \
       --json "$out/moekit_$preset.json" 2>"$logs/bench_$preset.err" | tee "$logs/bench_$preset.log"; then
    moekit_json+=("$out/moekit_$preset.json")
  else
    tail -n 20 "$logs/bench_$preset.err"; status=1
  fi
  echo "== $preset: moekit bench, --fp8-accumulation exact (GEMM1 on moekit's 32-K WGMMA kernel)"
  "$cli" bench --inputs "$layer" --name "$preset" --tokens "$tokens" --fp8-accumulation exact \
    --json "$work/moekit_exact_$preset.json" 2>"$logs/bench_exact_$preset.err" | tee "$logs/bench_exact_$preset.log" ||
    status=1
  echo "== $preset: peers"
  if python3 "$root/bench/peers/moe_peers.py" --layer "$layer" --moekit-out "$work/$preset.out.safetensors" \
       --name "$preset" --tokens "$tokens" --json "$out/peers_$preset.json" 2>&1 | tee "$logs/peers_$preset.log"; then
    peer_json+=("$out/peers_$preset.json")
  else
    status=1
  fi
  rm -f "$layer" "$work/$preset.out.safetensors"
done

if [ ${#moekit_json[@]} -gt 0 ]; then
  python3 "$root/bench/plot.py" --moekit "${moekit_json[@]}" --peers "${peer_json[@]}" --out "$out/bench.png" ||
    status=1
  echo
  echo "== moekit vs peers"
  python3 "$root/bench/report.py" --moekit "${moekit_json[@]}" --peers "${peer_json[@]}" \
    --markdown "$out/table.md" || status=1
fi
for f in "$logs"/*; do echo "==== $(basename "$f")"; tail -n 40 "$f"; done >"$out/device-bench.log" 2>&1
exit $status
