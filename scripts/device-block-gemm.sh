#!/usr/bin/env bash
# moekit's FP8 block-scaled grouped GEMM on a GPU machine, in one call: build (CUDA, 16 jobs), its
# tests, grouped_gemm_bench on bench/cases/prefill.txt beside CUTLASS's tiles, optionally ncu on it
# and DeepGEMM (../shared/peers/deepgemm, carried as .peers/deepgemm) on the same groups; a short
# table last.
#   MOEKIT_BLOCK_STEPS="tests bench"   (also: ncu ncufull sass sassdg peers)
#   MOEKIT_SASS_TILES="cooperative;128x192 persistent wgmma"   the sass step's tiles (MOEKIT_BENCH_TILES
#     each: parts of the bench's tile names; the first tile that matches is profiled), ;-separated
#   MOEKIT_BENCH_TILES=persistent,cooperative,ping-pong   the tiles benched
#   MOEKIT_TEST_FILTER='*persistent*:*Persistent*'      the CUDA tests run
#   MOEKIT_{TEST,BENCH,PEER}_TIMEOUT seconds (300, 300, 400)
#   MOEKIT_WATCHDOG=1   kernels trap, naming the barrier, when a barrier wait spins for seconds
#   MOEKIT_PREBUILT=DIR   no build: DIR's tests/test_cuda and bench/grouped_gemm_bench, built
#     elsewhere for sm_90a and carried (saves the ~70 s build of device time)
#   carry: .cutlass .gtest (no registry there), .peers for the peers step; or the prebuilt binaries
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
steps="${MOEKIT_BLOCK_STEPS:-tests bench}"
export PATH="/usr/local/cuda/bin:$PATH"
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
build="${MOEKIT_PREBUILT:-${MOEKIT_BUILD_DIR:-/tmp/moekit-build}}"
targets="grouped_gemm_bench test_cuda"
start=$(date +%s)
if [ -n "${MOEKIT_PREBUILT:-}" ]; then
  for bin in tests/test_cuda bench/grouped_gemm_bench; do
    [ -x "$build/$bin" ] || { echo "MOEKIT_PREBUILT: $build/$bin is missing"; exit 1; }
  done
  echo "prebuilt in $build"
elif ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=ON \
      -DMOEKIT_GTEST_SOURCE="$root/.gtest" -DMOEKIT_CUTLASS_DIR="$root/.cutlass" \
      -DMOEKIT_BARRIER_WATCHDOG="$([ "${MOEKIT_WATCHDOG:-0}" = 1 ] && echo ON || echo OFF)" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j 16 --target $targets >>"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 30
  echo "BUILD FAILED"
  exit 1
else
  echo "built in $(( $(date +%s) - start )) s"
fi
status=0
if [[ " $steps " == *" tests "* ]]; then
  echo "== test_cuda ${MOEKIT_TEST_FILTER:-*persistent*:*Persistent*}"
  timeout "${MOEKIT_TEST_TIMEOUT:-300}" "$build/tests/test_cuda" --gtest_color=no --gtest_filter="${MOEKIT_TEST_FILTER:-*persistent*:*Persistent*}" \
    >"$out/tests.log" 2>&1 || status=1
  grep -E "^\[  FAILED|^\[  PASSED|Failure|error|Expected|Which is" "$out/tests.log" | head -n 40
fi
if [[ " $steps " == *" bench "* ]]; then
  echo "== grouped_gemm_bench --cases"
  MOEKIT_BENCH_TILES="${MOEKIT_BENCH_TILES:-persistent,cooperative,ping-pong}" timeout "${MOEKIT_BENCH_TIMEOUT:-300}" \
    "$build/bench/grouped_gemm_bench" --cases "$root/bench/cases/prefill.txt" >"$out/gemm.log" 2>&1 || status=1
fi
if [[ " $steps " == *" ncu "* ]]; then
  # One profiled launch per persistent tile on the first case: its time, DRAM bytes read and written,
  # L2 hit rate, SM throughput and tensor-pipe share, row by row.
  echo "== ncu (the first case, persistent tiles, one launch each)"
  head -n 3 "$root/bench/cases/prefill.txt" | grep -v "^#" >/tmp/ncu_case.txt
  MOEKIT_BENCH_ONCE=1 MOEKIT_BENCH_TILES=persistent timeout 300 ncu --clock-control none -k regex:"fp8_block_gemm|fp8_block_swap" --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
    "$build/bench/grouped_gemm_bench" --cases /tmp/ncu_case.txt >"$out/ncu.log" 2>&1 || status=1
  python3 - "$out/ncu.log" <<'EOF'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
rows = [r for r in csv.reader(l for l in lines if l.startswith('"')) if len(r) > 10]
tiles = [l.split(" groups=")[0].split(None, 1)[1].strip() for l in lines if " us " in l and " groups=" in l]
if not rows:
    print("\n".join(lines[-10:]))
    sys.exit()
head, rows = rows[0], rows[1:]
ids, names, values = head.index("ID"), head.index("Metric Name"), head.index("Metric Value")
per = {}
for r in rows:
    per.setdefault(int(r[ids]), {})[r[names]] = float(r[values].replace(",", ""))
for i, m in sorted(per.items()):
    name = tiles[i] if i < len(tiles) else f"launch {i}"
    print(f"{name[:70]:70} {m.get('gpu__time_duration.sum', 0) / 1e3:9.1f} us  DRAM read {m.get('dram__bytes_read.sum', 0) / 1e9:6.2f} GB"
          f" write {m.get('dram__bytes_write.sum', 0) / 1e9:5.2f} GB  L2 hit {m.get('lts__t_sector_hit_rate.pct', 0):5.1f}%"
          f"  SM {m.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', 0):5.1f}%"
          f"  gmma {m.get('sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active', 0):5.2f}%")
EOF
fi
if [[ " $steps " == *" ncufull "* ]]; then
  echo "== ncu --set full (the first case: CUTLASS's 128x128, then the persistent tiles)"
  grep -v "^#" "$root/bench/cases/prefill.txt" | head -n 1 >/tmp/ncu_case.txt
  for tiles in cooperative "${MOEKIT_NCU_TILES:-128x128 persistent}"; do
    MOEKIT_BENCH_TILES="$tiles" timeout 200 ncu --clock-control none --set full --import-source no -k regex:"fp8_block_gemm|device_kernel" -c 1 --launch-skip 3 \
      "$build/bench/grouped_gemm_bench" --cases /tmp/ncu_case.txt >"$out/ncu_$(echo "$tiles" | tr -c 'a-z0-9' '_').log" 2>&1 || status=1
  done
  grep -hE "^  [a-z]|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|L1/TEX Hit|L2 Hit|Shared Memory" "$out"/ncu_*.log | head -n 60
fi
if [[ " $steps " == *" sass "* ]]; then
  # Warp-stall samples and executed instructions per SASS line (SourceCounters) of each of
  # MOEKIT_SASS_TILES on the first case: scripts/sass_profile.py summarizes each by opcode and
  # region; the CSVs come back for a closer look.
  grep -v "^#" "$root/bench/cases/prefill.txt" | head -n 1 >/tmp/ncu_case.txt
  IFS=';' read -r -a sass_tiles <<<"${MOEKIT_SASS_TILES:-cooperative;128x192 persistent wgmma}"
  for tiles in "${sass_tiles[@]}"; do
    name=$(echo "$tiles" | tr -c 'a-z0-9\n' '_')
    echo "== sass profile: $tiles"
    MOEKIT_BENCH_TILES="$tiles" timeout 200 ncu --clock-control none -k regex:"fp8_block_gemm|device_kernel" -c 1 \
      --launch-skip 3 --section SourceCounters --section SpeedOfLight -f -o "/tmp/sass_$name" \
      "$build/bench/grouped_gemm_bench" --cases /tmp/ncu_case.txt >"/tmp/sass_$name.log" 2>&1 || status=1
    ncu -i "/tmp/sass_$name.ncu-rep" --page source --csv --print-source sass >"$out/sass_$name.csv" 2>>"/tmp/sass_$name.log"
    python3 "$root/scripts/sass_profile.py" "$out/sass_$name.csv" | head -n 40
  done
fi
dg="$root/.peers/deepgemm"
build_dg() {  # DeepGEMM's extension (../shared/peers/deepgemm/README.md), once per call
  [ -f "$dg/DeepGEMM/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" ] && return 0
  local torch_dir py_inc
  torch_dir=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
  py_inc=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
  (cd "$dg" && ./build_ext.sh "$torch_dir" "$py_inc" /usr/local/cuda "$dg/DeepGEMM/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so") \
    >"$out/dg_build.log" 2>&1
}
if [[ " $steps " == *" sassdg "* ]]; then
  # The same per-SASS-line profile of DeepGEMM's kernel on the first case (8 x 4096, N 4096, K 7168):
  # a few calls of m_grouped_fp8_gemm_nt_contiguous on bench_dg.py's inputs, the fourth profiled.
  echo "== sass profile: DeepGEMM"
  cat >/tmp/dg_one.py <<'EOF'
import sys, torch
sys.path.insert(0, sys.argv[1])
import bench_dg as b
import deep_gemm
b.ALIGN = deep_gemm.get_mk_alignment_for_contiguous_layout()
counts = [4096] * 8
w, sfb = b.make_weights(len(counts), b.N1, b.K1, seed=1)
a, sfa, lay, _, m_pad = b.make_contig(counts, b.K1, seed=101)
sfa_t = b.tma_aligned_mn_major(sfa)
d = torch.empty((m_pad, b.N1), dtype=torch.bfloat16, device='cuda')
for _ in range(5):
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa_t), (w, sfb), d, lay)
torch.cuda.synchronize()
EOF
  if build_dg; then
    python3 /tmp/dg_one.py "$dg" >/tmp/sass_dg_warm.log 2>&1 || { status=1; tail -n 5 /tmp/sass_dg_warm.log; }
    timeout 300 ncu --clock-control none -k regex:"fp8_gemm" -c 1 --launch-skip 3 --section SourceCounters \
      --section SpeedOfLight -f -o /tmp/sass_dg python3 /tmp/dg_one.py "$dg" >/tmp/sass_dg.log 2>&1 || status=1
    ncu -i /tmp/sass_dg.ncu-rep --page source --csv --print-source sass >"$out/sass_deepgemm.csv" 2>>/tmp/sass_dg.log
    python3 "$root/scripts/sass_profile.py" "$out/sass_deepgemm.csv" | head -n 40
    grep -E "Duration|Throughput|==PROF==|rror" /tmp/sass_dg.log | head -n 12
  else
    status=1
    tail -n 5 "$out/dg_build.log"
  fi
fi
if [[ " $steps " == *" peers "* ]]; then
  echo "== DeepGEMM on the same groups"
  python3 - "$root/bench/cases/prefill.txt" >/tmp/dg_cases.json <<'EOF'
import json, sys
out = {}
for line in open(sys.argv[1]):
    f = line.split()
    if not f or f[0].startswith('#') or not f[0].startswith(('v3g', 'hot')):
        continue
    out[f[0]] = {'desc': f[0], 'counts': [int(x) for x in f[3:]], 'gemm': 1 if f[1] == '4096' else 2}
print(json.dumps(out))
EOF
  (build_dg && cd "$dg" && DG_EXTRA_CASES=/tmp/dg_cases.json timeout "${MOEKIT_PEER_TIMEOUT:-400}" python3 bench_dg.py --out /tmp/dg \
     >"$out/dg.log" 2>&1) || status=1
  tail -n 30 "$out/dg.log"
fi
echo "== summary (TFLOP/s count the rows that carry data)"
[ -f "$out/gemm.log" ] && grep -E "TFLOP|skipped" "$out/gemm.log" | cut -c1-175
exit $status
