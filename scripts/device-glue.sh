#!/usr/bin/env bash
# Decode and middle T on a GPU machine, in steps (issue #30's figures): the CUDA tests of a filter,
# ncu's time of every kernel of `moekit run` (the second call's), the warp stall reasons of the
# kernels around the GEMMs, and `moekit bench --inputs` on each preset's layer file beside vLLM's two
# GEMMs (../shared/peers/vllm, carried as .peers/vllm) on the same file, same call. A table last.
#   MOEKIT_GLUE_STEPS="tests ncu peers"       (also: sanitize, compute-sanitizer memcheck, racecheck and
#     synccheck over MOEKIT_SANITIZE_FILTER in reduced shapes, beside the tests; stalls; tune: `moekit tune` of the presets at
#     MOEKIT_TUNE_TOKENS into $OUT/h200.json, a copy of data/tuning/h200.json, which the peers step's
#     bench then takes: the shipped cache with those buckets re-measured)
#   fetch: the glue kernels' PC samples with caches flushed and kept (each kernel's instruction-fetch stalls and
#     runs of executed SASS: at decode sizes their time is fetching cold code, s22)
#   profile: ncu --set full on the decode GEMMs and the routing kernel of each MOEKIT_NCU_RUNS pair, the
#     routing kernel's SASS, and (nsys, where installed) the layer's kernels under CUDA graphs on a timeline
#   gemm: bench/grouped_gemm_bench --cases on decode routings (MOEKIT_GEMM_TILES, default the decode tiles):
#     deepseek-v3 and qwen3-30b-a3b GEMM1/GEMM2 with T tokens spread over distinct experts, T in MOEKIT_GEMM_TOKENS
#   MOEKIT_TEST_FILTER='CudaActivation*:...'  the tests step's CUDA tests
#   MOEKIT_NCU_RUNS="deepseek-v3:1 qwen3-30b-a3b:8"   preset:T pairs the ncu and stalls steps profile
#   MOEKIT_GLUE_PATH=staged                   --path of the profiled runs
#   MOEKIT_PEER_PRESETS=qwen3-30b-a3b,deepseek-v3   MOEKIT_PEER_TOKENS=1,8,64,512
#   MOEKIT_WATCHDOG=1   kernels trap, naming the barrier, when a barrier wait spins for seconds
#   MOEKIT_PREBUILT=DIR   no build: DIR's moekit, tests/test_cuda, bench/grouped_gemm_bench and tuning/ (the
#     shipped caches the CLI looks for beside itself: without them the layer runs the heuristic's tactics),
#     built elsewhere and carried (carry those four paths, ~17 MB)
#   carry: .cutlass .gtest (no registry there), .peers/vllm for the peers step
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
steps="${MOEKIT_GLUE_STEPS:-tests ncu peers}"
runs="${MOEKIT_NCU_RUNS:-deepseek-v3:1 qwen3-30b-a3b:8}"
path="${MOEKIT_GLUE_PATH:-staged}"
peer_tokens="${MOEKIT_PEER_TOKENS:-1,8,64,512}"
export PATH="/usr/local/cuda/bin:$PATH"
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
build="${MOEKIT_PREBUILT:-${MOEKIT_BUILD_DIR:-/tmp/moekit-build}}"
start=$SECONDS
if [ -n "${MOEKIT_PREBUILT:-}" ]; then
  for need in moekit tests/test_cuda bench/grouped_gemm_bench tuning; do
    [ -e "$build/$need" ] || { echo "MOEKIT_PREBUILT: $build/$need is missing"; exit 1; }
  done
  echo "prebuilt in $build"
elif ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=ON \
      -DMOEKIT_GTEST_SOURCE="$root/.gtest" -DMOEKIT_CUTLASS_DIR="$root/.cutlass" \
      -DMOEKIT_BARRIER_WATCHDOG="$([ "${MOEKIT_WATCHDOG:-0}" = 1 ] && echo ON || echo OFF)" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j 16 --target test_cuda moekit_cli grouped_gemm_bench >>"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 30
  echo "BUILD FAILED"
  exit 1
else
  echo "built in $((SECONDS - start)) s"
fi
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
cli="$build/moekit"
status=0
summary=()

# The sanitizers (correctness only: they time nothing) run beside the tests.
sanitize_pids=()
if [[ " $steps " == *" sanitize "* ]]; then
  for tool in memcheck racecheck synccheck; do
    (MOEKIT_CUDA_TEST_SMALL=1 timeout "${MOEKIT_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" \
       --report-api-errors no --error-exitcode 3 "$build/tests/test_cuda" --gtest_color=no \
       --gtest_filter="${MOEKIT_SANITIZE_FILTER:-*Activated*:CudaFinalize*:CudaActivation*:CudaPermute*}" \
       >"$out/$tool.log" 2>&1; echo $? >"/tmp/$tool.rc") &
    sanitize_pids+=($!)
  done
fi

if [[ " $steps " == *" tests "* ]]; then
  filter="${MOEKIT_TEST_FILTER:-CudaActivation*:CudaRows*:CudaPermute*:CudaLayer*:CudaFinalize*:CudaRouting*}"
  echo "== test_cuda $filter"
  timeout "${MOEKIT_TEST_TIMEOUT:-300}" "$build/tests/test_cuda" --gtest_color=no --gtest_filter="$filter" \
    >"$out/tests.log" 2>&1 || status=1
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$out/tests.log" | head -n 30
  summary+=("tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/tests.log" | tr '\n' ' ')")
fi

if [ ${#sanitize_pids[@]} -gt 0 ]; then
  wait "${sanitize_pids[@]}"
  for tool in memcheck racecheck synccheck; do
    rc=$(cat "/tmp/$tool.rc")
    [ "$rc" = 0 ] || status=1
    summary+=("$tool: rc $rc, $(grep -cE '^\[       OK' "$out/$tool.log") tests OK, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -n 1)")
  done
fi

if [[ " $steps " == *" gemm "* ]]; then
  # T tokens x 8 experts each, spread over distinct experts as far as they go (T=1: 8 groups of 1 row).
  python3 - "${MOEKIT_GEMM_TOKENS:-1,8}" >/tmp/gemm_cases.txt <<'PY'
import sys
for t in map(int, sys.argv[1].split(",")):
    for name, e, shapes in (("deepseek-v3", 256, ((4096, 7168), (7168, 2048))), ("qwen3-30b-a3b", 128, ((1536, 2048), (2048, 768)))):
        rows = [0] * e
        for s in range(t * 8):
            rows[(s * 37) % e] += 1
        for i, (n, k) in enumerate(shapes):
            print(f"{name}_T{t}_gemm{i + 1} {n} {k} " + " ".join(map(str, rows)))
PY
  bench_bin="$(find "$build" -name grouped_gemm_bench -type f | head -n 1)"
  echo "== grouped_gemm_bench --cases (decode routings, T=${MOEKIT_GEMM_TOKENS:-1,8})"
  MOEKIT_BENCH_TILES="${MOEKIT_GEMM_TILES:-W as A,warp mma}" timeout 200 "$bench_bin" --cases /tmp/gemm_cases.txt \
    >"$out/gemm.txt" 2>&1 || status=1
  grep -E " us " "$out/gemm.txt" | sed -E 's/ +/ /g; s/groups=[0-9]+ //; s/ N=[0-9]+ K=[0-9]+//; s/TFLOP.s //' | cut -c1-150
  # MOEKIT_GEMM_NCU=label: Nsight Compute's sections on the decode kernels of that case alone
  if [ -n "${MOEKIT_GEMM_NCU:-}" ]; then
    grep "^${MOEKIT_GEMM_NCU} " /tmp/gemm_cases.txt >/tmp/gemm_ncu_case.txt
    MOEKIT_BENCH_TILES="${MOEKIT_GEMM_NCU_TILES:-8 rows x}" timeout 200 ncu -k regex:fp8_decode --launch-count 12 \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      "$bench_bin" --cases /tmp/gemm_ncu_case.txt >"$out/gemm_ncu.txt" 2>&1 || status=1
    grep -E "fp8_decode|Duration|DRAM Throughput|Memory Throughput|Warp Cycles Per Issued|Stall|Grid Size" "$out/gemm_ncu.txt" | head -n 80
  fi
fi

if [[ " $steps " == *" ncu "* ]]; then
  for run in $runs; do
    IFS=: read -r preset t <<<"$run"
    echo "== ncu: moekit run --preset $preset --tokens $t --path $path, the second call: us (busiest SM's active cycles)"
    timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,sm__cycles_active.max --csv "$cli" run --preset "$preset" --tokens "$t" --backend cuda \
      --path "$path" >"/tmp/ncu_${preset}_$t.csv" 2>/dev/null || status=1
    python3 - "/tmp/ncu_${preset}_$t.csv" <<'PY' | tee -a "$out/ncu.txt"
import csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, metric, value, ident = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("ID")
def short(n):
    n = re.sub(r"\(.*", "", re.sub(r"^void ", "", n.replace("<unnamed>::", "")))
    return re.sub(r".*::", "", re.sub(r"<.*", "", n))
kernels = {}
for r in rows:
    kernels.setdefault(int(r[ident]), [short(r[name]), {}])[1][r[metric]] = float(r[value].replace(",", ""))
second = [kernels[i] for i in sorted(kernels)][len(kernels) // 2:]
us = [(n, m["gpu__time_duration.sum"] / 1000, m["sm__cycles_active.max"]) for n, m in second]
print("  ".join(f"{n}={t:.1f} ({c:.0f})" for n, t, c in us), f"| sum {sum(t for _, t, _ in us):.1f}")
PY
  done
fi

if [[ " $steps " == *" stalls "* ]]; then
  for run in $runs; do
    IFS=: read -r preset t <<<"$run"
    echo "== ncu WarpStateStats, kernels other than the GEMMs: $preset T=$t"
    timeout 200 ncu --section WarpStateStats --section LaunchStats --section SpeedOfLight --clock-control none \
      -k 'regex:^(?!.*gemm).*' "$cli" run --preset "$preset" --tokens "$t" --backend cuda --path "$path" \
      >"$out/stalls_${preset}_$t.txt" 2>&1 || status=1
    grep -E "^  [a-z_]+.*\(|Duration|Warp Cycles Per Issued|Grid Size|Block Size|Registers Per" "$out/stalls_${preset}_$t.txt" | head -n 80
  done
fi

cache=()
if [[ " $steps " == *" tune "* ]]; then
  cp "$root/data/tuning/h200.json" "$out/h200.json"
  for preset in $(echo "${MOEKIT_PEER_PRESETS:-qwen3-30b-a3b,deepseek-v3}" | tr ',' ' '); do
    echo "== moekit tune --preset $preset --tokens ${MOEKIT_TUNE_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024}"
    start=$SECONDS
    timeout 300 "$cli" tune --preset "$preset" --tokens "${MOEKIT_TUNE_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024}" \
      --out "$out/h200.json" >"$out/tune_$preset.log" 2>&1 || status=1
    grep -E "^ +[0-9]+ |measurements" "$out/tune_$preset.log" | cut -c1-150 | head -n 24
    echo "tuned in $((SECONDS - start)) s"
  done
  cache=(--tuning-cache "$out/h200.json")
  echo "== the cache's staged times against an additive model (residuals: the tuner's noise)"
  python3 "$root/scripts/tuning_additivity.py" "$out/h200.json"
fi

if [[ " $steps " == *" peers "* ]]; then
  for preset in $(echo "${MOEKIT_PEER_PRESETS:-qwen3-30b-a3b,deepseek-v3}" | tr ',' ' '); do
    echo "== $preset: moekit bench --inputs (the preset's T=4096 layer file) and vLLM's GEMMs on it, T=$peer_tokens"
    layer="/tmp/layer_$preset.safetensors" dump="/tmp/dump_$preset.safetensors"
    timeout 200 "$cli" run --preset "$preset" --tokens 4096 --backend cuda --save-layer "$layer" --dump "$dump" >/dev/null 2>&1 || status=1
    timeout 150 "$cli" bench --inputs "$layer" --tokens "$peer_tokens" "${cache[@]}" --stages --json "$out/inputs_$preset.json" \
      >"$out/inputs_$preset.log" 2>&1 || status=1
    (cd "$root/.peers/vllm" && timeout 200 python3 bench_vllm.py --layer "$layer" --dump "$dump" --tokens "$peer_tokens" \
       --no-ref --out "$out/vllm_$preset.json" >"$out/vllm_$preset.log" 2>&1) || status=1
    python3 - "$out/inputs_$preset.json" "$out/vllm_$preset.json" <<'PY' | tee -a "$out/peers.txt"
import json, sys
m = json.load(open(sys.argv[1]))
try:
    v = json.load(open(sys.argv[2]))
except Exception as e:
    v = {}
peer = {}
for r in v.get("results", []):
    if "gemm1_plus_gemm2_us" in r: peer[int(r["T"])] = (r["gemm1_plus_gemm2_us"], r["weight_gbps_gemms"])
print("copy", m.get("ceilings", {}).get("copy_gbs"), "GB/s")
for c in m["cases"]:
    t = c["tokens"]
    steps = " ".join(f"{k}={x:.1f}" for k, x in c.get("stages", {}).items())
    p, gbs = peer.get(t, (float("nan"), float("nan")))
    print(f"T={t:>5} moekit {c['us']:8.1f} us  vLLM GEMMs {p:8.1f} us ({gbs:.0f} GB/s)  {steps}")
    graph = " ".join(f"{k}={x:.1f}" for k, x in c.get("graph_stages", {}).items())
    if graph: print(f"        steps in graph replays: {graph}")
PY
  done
fi

if [[ " $steps " == *" profile "* ]]; then
  # Nsight Compute's full sections on the decode GEMMs and the routing kernel of `moekit run` (both
  # calls), the routing kernel's SASS with its samples; where nsys is installed, the layer's kernels
  # under CUDA graphs (`bench --inputs`, graph nodes traced) as a timeline: gaps and overlaps.
  for run in $runs; do
    IFS=: read -r preset t <<<"$run"
    rep="/tmp/profile_${preset}_$t"
    echo "== ncu --set full (fp8_decode, route_): $preset T=$t"
    timeout 300 ncu --set full --warp-sampling-interval 0 --import-source yes -k 'regex:fp8_decode|route_' -o "$rep" -f "$cli" run --preset "$preset" \
      --tokens "$t" --backend cuda --path "$path" >/dev/null 2>&1 || status=1
    ncu --import "$rep.ncu-rep" --page details >"$out/profile_${preset}_$t.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page source --print-source sass --csv >"$out/sass_${preset}_$t.txt" 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Warp Cycles Per Issued|Achieved Occupancy|One or More|Stall" \
      "$out/profile_${preset}_$t.txt" | head -n 60
    if command -v nsys >/dev/null; then
      layer="/tmp/layer_$preset.safetensors"
      [ -f "$layer" ] || timeout 200 "$cli" run --preset "$preset" --tokens 4096 --backend cuda --save-layer "$layer" >/dev/null 2>&1
      timeout 200 nsys profile --cuda-graph-trace=node -o "/tmp/timeline_${preset}_$t" --force-overwrite true \
        "$cli" bench --inputs "$layer" --tokens "$t" >/dev/null 2>&1 || status=1
      nsys stats --report cuda_gpu_trace --format csv "/tmp/timeline_${preset}_$t.nsys-rep" >"$out/timeline_${preset}_$t.txt" 2>&1
      echo "== nsys: the last launches of the layer under graphs (start ns, duration ns, kernel)"
      python3 - "$out/timeline_${preset}_$t.txt" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
if "Start (ns)" not in head:
    print("no trace"); sys.exit()
s, d, n = head.index("Start (ns)"), head.index("Duration (ns)"), head.index("Name")
last = rows[-12:]
t0 = int(last[0][s])
for r in last:
    print(f"{int(r[s]) - t0:>8} {int(r[d]):>7}  {r[n][:90]}")
PY
    else
      echo "(no nsys on this machine)"
    fi
  done
fi

if [[ " $steps " == *" fetch "* ]]; then
  # The glue kernels' PC samples with the caches flushed before each (as the GEMMs' weight stream leaves
  # them in the layer): per kernel, the samples by stall reason and the runs of executed SASS (each jump into
  # code not yet fetched costs an instruction-fetch stall: s22, perf-log/decode.md).
  for run in $runs; do
    IFS=: read -r preset t <<<"$run"
    for cc in all none; do
      rep="/tmp/fetch_${preset}_${t}_$cc"
      timeout 200 ncu --section WarpStateStats --section SourceCounters --warp-sampling-interval 0 --cache-control "$cc" \
        --clock-control none -k 'regex:^(?!.*(gemm|fp8_decode|warp_mma)).*' -c 6 -o "$rep" -f "$cli" run \
        --preset "$preset" --tokens "$t" --backend cuda --path "$path" >/dev/null 2>&1 || status=1
      ncu --import "$rep.ncu-rep" --page source --print-source sass --csv >"/tmp/fetch_sass.csv" 2>/dev/null
      echo "== $preset T=$t, caches $([ "$cc" = all ] && echo flushed || echo kept): samples of 32 cycles"
      python3 - /tmp/fetch_sass.csv <<'PY' | tee -a "$out/fetch.txt"
import csv, sys
kernels, cur = [], None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0] == "Kernel Name":
        cur = [r[1], None, []]; kernels.append(cur)
    elif cur is not None and cur[1] is None: cur[1] = r
    elif cur is not None: cur[2].append(r)
for name, head, data in kernels:
    iS, iE = head.index("Warp Stall Sampling (All Samples)"), head.index("Instructions Executed")
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    by = {h[6:]: sum(int(r[head.index(h)] or 0) for r in data) for h in reasons}
    ran = [i for i, r in enumerate(data) if int(r[iE] or 0) > 0]
    runs = 1 + sum(1 for a, b in zip(ran, ran[1:]) if b > a + 1) if ran else 0
    top = " ".join(f"{k}={v}" for k, v in sorted(by.items(), key=lambda x: -x[1])[:5])
    print(f"  {name.split('(')[0][-48:]:48s} samples {sum(int(r[iS] or 0) for r in data):5d}  runs {runs:3d} of "
          f"{len(ran)} executed / {len(data)} SASS lines  {top}")
PY
    done
  done
fi

echo "== summary"
for line in "${summary[@]}"; do echo "$line"; done
# At most 8 files come back from a lent machine: the logs go in one archive.
(cd "$out" && tar czf logs.tgz --remove-files -- *.log *.txt 2>/dev/null)
exit $status
