#!/usr/bin/env bash
# Tuning on a GPU machine (docs/TUNE.md): `moekit tune` of the presets over T = 1 ... 16384 into a
# fresh cache, `tune --verify` of it (one preset), the CUDA tests of the tactics, then `moekit bench`
# of the heuristic and the tuned layer side by side on the same weights (--tuning-cache off,CACHE);
# a table last.
#   MOEKIT_PREBUILT=DIR scripts/device-tune.sh   DIR/moekit (and DIR/lib/*.so; DIR/tests/test_cuda,
#                                                when there, runs the tactic tests) built elsewhere
#   MOEKIT_TUNE_PRESETS=deepseek-v3,qwen3-30b-a3b
#   MOEKIT_TUNE_TOKENS=1,2,4,...,16384            the buckets (powers of two)
#   MOEKIT_TUNE_VERIFY=qwen3-30b-a3b              presets re-timed by `tune --verify` ("" skips)
#   MOEKIT_TUNE_BENCH=1                            0 skips the side-by-side bench
# Writes $OUT/h200.json (the cache, for data/tuning/), tune.log, verify.log, tests.log,
# bench1/2.json and bench1/2.log (the two orders). Exit 1 when a step failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
bin="${MOEKIT_PREBUILT:-$root/build}"
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
presets="${MOEKIT_TUNE_PRESETS:-deepseek-v3,qwen3-30b-a3b}"
tokens="${MOEKIT_TUNE_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384}"
verify="${MOEKIT_TUNE_VERIFY-qwen3-30b-a3b}"
cache="$out/h200.json"
rm -f "$cache"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

echo "== moekit tune --preset $presets --tokens $tokens"
start=$SECONDS
if ! "$bin/moekit" tune --preset "$presets" --tokens "$tokens" --out "$cache" >"$out/tune.log" 2>"$out/tune.err"; then
  tail -n 5 "$out/tune.err"
  status=1
fi
tune_s=$((SECONDS - start))
grep -E "measurements in|^tune: wrote" "$out/tune.err" "$out/tune.log" | sed 's/^[^:]*://'
echo "tune: ${tune_s} s in all (weights generated included)"

if [ -n "$verify" ] && [ -f "$cache" ]; then
  echo "== moekit tune --verify --preset $verify"
  "$bin/moekit" tune --verify --preset "$verify" --tokens "$tokens" --cache "$cache" >"$out/verify.log" 2>&1 || status=1
  grep -E "ERROR|STALE|^verify:" "$out/verify.log"
fi

if [ -x "$bin/tests/test_cuda" ]; then
  echo "== test_cuda: the tactics (every candidate against the CPU references, bits, batch invariance)"
  if "$bin/tests/test_cuda" --gtest_filter='CudaLayerTactic*:*TacticChoice*:TacticChooser*:TacticBudget*' \
       >"$out/tests.log" 2>&1; then
    grep -E "^\[  PASSED" "$out/tests.log"
  else
    grep -E "^\[  FAILED|Failure" "$out/tests.log" | head -n 20
    status=1
  fi
fi

if [ "${MOEKIT_TUNE_BENCH:-1}" != "0" ] && [ -f "$cache" ]; then
  # Both orders on the same weights (heuristic pass first, then tuned first): a pass right after
  # a long prefill case runs warmer, and the two orders cancel that out.
  for order in "off,$cache" "$cache,off"; do
    n=$([ "$order" = "off,$cache" ] && echo 1 || echo 2)
    echo "== moekit bench --tuning-cache $order (the same weights, one pass each)"
    if ! "$bin/moekit" bench --preset "$presets" --tokens "$tokens" --graph on --tuning-cache "$order" \
         --json "$out/bench$n.json" >"$out/bench$n.log" 2>&1; then
      tail -n 5 "$out/bench$n.log"
      status=1
    fi
  done
fi

echo
echo "== what tuning changed (tune's own timings: CUDA graphs, cold L2, median of 20, tactics side by side)"
grep -E "^tune |\(changed\)" "$out/tune.log"
if [ -f "$cache" ]; then
  echo
  echo "== the fresh cache against an additive model (GEMM1 + GEMM2): residuals are the timer's noise"
  python3 "$root/scripts/tuning_additivity.py" "$cache"
fi
if [ -f "$out/bench1.json" ] && [ -f "$out/bench2.json" ]; then
  echo
  echo "== heuristic vs tuned layer (moekit bench: CUDA graphs, warm inputs rotated, median of 20; mean of both orders)"
  python3 - "$out/bench1.json" "$out/bench2.json" <<'PY'
import json, sys
rows = {}
for path in sys.argv[1:]:
    for c in json.load(open(path))["cases"]:
        tuned = c.get("tuning_cache", "") not in ("", "off")
        rows.setdefault((c["preset"], c["tokens"]), [[], []])[int(tuned)].append(c["us"])
print(f"{'preset':16} {'T':>6} {'heuristic':>10} {'tuned':>10} {'tuned/heur':>10}  (each order: heur/tuned)")
worst = 0.0
for (preset, t), (h, u) in rows.items():
    hm, um = sum(h) / len(h), sum(u) / len(u)
    ratio = um / hm
    worst = max(worst, ratio)
    each = "  ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(h, u))
    print(f"{preset:16} {t:>6} {hm:>10.1f} {um:>10.1f} {ratio:>10.3f}  {each}")
print(f"worst tuned/heuristic: {worst:.3f} (<= 1.02 is within the noise of one run)")
PY
fi
exit $status
