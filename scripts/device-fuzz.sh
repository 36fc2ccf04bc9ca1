#!/usr/bin/env bash
# The differential campaign on a GPU machine (issue #19, docs/FUZZ.md): `moekit fuzz --backend cuda`
# over MOEKIT_FUZZ_CASES random problems against the CPU references, within MOEKIT_FUZZ_SECONDS.
#   MOEKIT_PREBUILT=DIR scripts/device-fuzz.sh   DIR/moekit (and DIR/lib/*.so) built elsewhere
#   MOEKIT_FUZZ_CASES=10000  MOEKIT_FUZZ_SECONDS=540  MOEKIT_FUZZ_SEED=<fresh, printed>
#   MOEKIT_FUZZ_BACKEND=cuda (cpu: the same script on a machine without a GPU)
# Writes $OUT/fuzz.log (one line per case) and $OUT/fuzz.json; prints the summary and the failed
# cases (each replays with `moekit fuzz --backend cuda --replay SEED`) last. Exit 1 on any failure.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
bin="${MOEKIT_PREBUILT:-$root/build}"
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
cases="${MOEKIT_FUZZ_CASES:-10000}"
seconds="${MOEKIT_FUZZ_SECONDS:-540}"
backend="${MOEKIT_FUZZ_BACKEND:-cuda}"
seed="${MOEKIT_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"  # fresh per run, printed
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
echo "== moekit fuzz --backend $backend --cases $cases --seed $seed --time-limit $seconds"
start=$(date +%s)
# A case that finishes no line for MOEKIT_FUZZ_STALL seconds (default 45) is taken as hung: the
# stack of every host thread and the kernels in flight (cuda-gdb attached, where there is one)
# are printed, then the campaign ends (exit 3). Lines are flushed one by one (stdbuf).
stall="${MOEKIT_FUZZ_STALL:-45}"
stdbuf -oL "$bin/moekit" fuzz --backend "$backend" --cases "$cases" --seed "$seed" --time-limit "$seconds" \
  --case-timeout 0 --json "$out/fuzz.json" >"$out/fuzz.log" 2>&1 &
pid=$!
last=-1 quiet=0 hung=0
while kill -0 "$pid" 2>/dev/null; do
  sleep 5
  size=$(stat -c %s "$out/fuzz.log")
  if [ "$size" = "$last" ]; then quiet=$((quiet + 5)); else quiet=0 last=$size; fi
  if [ "$quiet" -ge "$stall" ]; then
    hung=1
    echo "== no case line for $stall s after: $(tail -n 1 "$out/fuzz.log" | cut -c1-200)"
    if command -v cuda-gdb >/dev/null; then
      timeout 90 cuda-gdb -p "$pid" -batch -ex "info cuda kernels" -ex "thread apply all bt 16" 2>&1 |
        grep -vE "^\[New |^$|^warning" | head -n 120
    fi
    kill -9 "$pid"
    break
  fi
done
wait "$pid"
status=$?
[ "$hung" = 1 ] && status=3
echo "ran in $(( $(date +%s) - start )) s, exit $status"
grep -E "^case .* FAIL" "$out/fuzz.log" | head -n 20 | cut -c1-600
# The summary: from "fuzz summary:" to the end of the log (an error line if it died early).
sed -n '/^fuzz summary:/,$p' "$out/fuzz.log" | grep -v "^  case " | head -n 40
[ "$status" -eq 0 ] || tail -n 3 "$out/fuzz.log"
exit $status
