#!/usr/bin/env bash
# Builds side by side in one device call, beside vLLM: variants of moekit built here and carried
# (no build on the lent machine: its minutes go to measuring), each one's CUDA tests and
# compute-sanitizer runs, then `moekit bench --inputs --stages` of every variant on each layer
# file, the variants interleaved round by round, and vLLM 0.33's fused-MoE kernels on the same
# files (its two GEMMs alone and its whole pipeline). A table last.
#
# Here, per variant (the tree at the revision to measure; build-dev configured by scripts/build.sh):
#   ninja -C build-dev moekit test_cuda && scripts/device-variants.sh --keep NAME build-dev
# which copies moekit, tests/test_cuda and tuning/ (the shipped caches, found beside the CLI) into
# variants/NAME (git-ignored, ~16 MB a variant). On the device (carry: variants, .peers/vllm):
#   MOEKIT_VARIANTS="main try" scripts/device-variants.sh
# Settings (environment):
#   MOEKIT_VARIANTS="main"            the folders of variants/ to run, in this order each round
#   MOEKIT_LAYERS="qwen3-30b-a3b deepseek-v3 deepseek-v3@zipf:1.2"   layer files made by the first
#     variant's `moekit run --tokens 4096 --save-layer` of each preset, @SKEW its --skew
#   MOEKIT_TOKENS=1,8,64              T of every variant on every layer; per variant and layer
#     MOEKIT_TOKENS_<variant>_<layer> (other characters as _, e.g. MOEKIT_TOKENS_try_deepseek_v3_zipf_1_2),
#     "-" to skip that pair
#   MOEKIT_ROUNDS=2                   interleaved rounds
#   MOEKIT_TESTS="try=CudaRouting*"   VARIANT=FILTER pairs: each variant's test_cuda on its filter
#   MOEKIT_TEST_SHARDS=1              processes of each test_cuda run at once (gtest's sharding; the
#     GPU shared: CudaLayerPast2GiB skips where its 48 GB are not free), each MOEKIT_TEST_TIMEOUT=300 s
#   MOEKIT_SANITIZE="try=CudaRouting*"   VARIANT=FILTER pairs: memcheck, racecheck and synccheck in
#     reduced shapes (MOEKIT_CUDA_TEST_SMALL=1)
#   MOEKIT_CHECK=1,64                 the first variant's `moekit run --check` of each layer's preset at these T
#   MOEKIT_PEERS=1                    vLLM on each layer file (0: none)
#   MOEKIT_STOP_AT=480                seconds after which no further bench, check or peer run starts
# $OUT gets summary.txt (the table), the tests' logs and raw.tgz (every JSON and log).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
variants_dir="$root/variants"

if [ "${1:-}" = "--keep" ]; then
  [ $# = 3 ] || { echo "usage: scripts/device-variants.sh --keep NAME BUILD_DIR"; exit 2; }
  dest="$variants_dir/$2"
  for need in moekit tests/test_cuda tuning; do
    [ -e "$3/$need" ] || { echo "--keep: $3/$need is missing (build moekit and test_cuda first)"; exit 1; }
  done
  rm -rf "$dest" && mkdir -p "$dest"
  cp "$3/moekit" "$3/tests/test_cuda" "$dest/" && cp -r "$3/tuning" "$dest/"
  echo "$dest: $(git -C "$root" describe --always --dirty) ($(du -sh "$dest" | cut -f1))"
  exit 0
fi

out="${OUT:-$root/device-out}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
raw="$(mktemp -d)"
read -r -a variants <<<"${MOEKIT_VARIANTS:-main}"
read -r -a layers <<<"${MOEKIT_LAYERS:-qwen3-30b-a3b deepseek-v3}"
rounds="${MOEKIT_ROUNDS:-2}"
stop_at="${MOEKIT_STOP_AT:-480}"
export PATH="/usr/local/cuda/bin:$PATH"
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
for v in "${variants[@]}"; do
  [ -x "$variants_dir/$v/moekit" ] || { echo "variants/$v/moekit is missing (scripts/device-variants.sh --keep)"; exit 1; }
done
note() { echo "$*" | tee -a "$summary"; }
late() { [ "$SECONDS" -ge "$stop_at" ]; }
key() { echo -n "$1" | tr -c 'A-Za-z0-9-' '_'; }
# LAYER is PRESET or PRESET@SKEW: sets preset, skew and k (the layer's file key).
split_layer() {
  preset="${1%%@*}" skew=none k="$(key "$1")"
  [ "$1" != "$preset" ] && skew="${1#*@}"
}
note "# $(date -u +%F) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) seed $MOEKIT_TEST_SEED;" \
  "variants ${variants[*]}"

shards="${MOEKIT_TEST_SHARDS:-1}"
for pair in ${MOEKIT_TESTS:-}; do
  v="${pair%%=*}" filter="${pair#*=}"
  pids=()
  for i in $(seq 0 $((shards - 1))); do
    GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$i" timeout "${MOEKIT_TEST_TIMEOUT:-300}" "$variants_dir/$v/test_cuda" \
      --gtest_filter="$filter" --gtest_brief=1 >"$raw/tests_${v}_$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  cat "$raw"/tests_"${v}"_*.log >"$out/tests_$v.log"
  note "tests $v '$filter' ($shards shards): rc $rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/tests_$v.log" | tr '\n' ' ')($SECONDS s)"
  [ "$rc" = 0 ] || grep -E "^\[  FAILED|Failure" "$out/tests_$v.log" | head -n 20 | tee -a "$summary"
done
for pair in ${MOEKIT_SANITIZE:-}; do
  v="${pair%%=*}" filter="${pair#*=}"
  for tool in memcheck racecheck synccheck; do
    MOEKIT_CUDA_TEST_SMALL=1 timeout 180 compute-sanitizer --tool "$tool" "$variants_dir/$v/test_cuda" \
      --gtest_filter="$filter" --gtest_brief=1 >"$raw/sanitize_${tool}_$v.log" 2>&1
    note "$tool $v '$filter': rc $? $(grep -E '^\[  PASSED|SUMMARY' "$raw/sanitize_${tool}_$v.log" | tr '\n' ' ')($SECONDS s)"
  done
done

for layer in "${layers[@]}"; do
  split_layer "$layer"
  "$variants_dir/${variants[0]}/moekit" run --preset "$preset" --tokens 4096 --backend cuda --skew "$skew" \
    --save-layer "$raw/layer_$k.safetensors" --dump "$raw/dump_$k.safetensors" >"$raw/make_$k.log" 2>&1 ||
    { note "$layer: moekit run --save-layer failed"; tail -n 5 "$raw/make_$k.log"; }
done

tokens_of() {  # variant, layer key
  local var="MOEKIT_TOKENS_${1}_${2//-/_}"
  echo "${!var:-${MOEKIT_TOKENS:-1,8,64}}"
}
for layer in "${layers[@]}"; do
  split_layer "$layer"
  for r in $(seq 1 "$rounds"); do
    for v in "${variants[@]}"; do
      t="$(tokens_of "$v" "$k")"
      [ "$t" = - ] && continue
      late && { note "late: $layer $v round $r not run"; continue; }
      "$variants_dir/$v/moekit" bench --inputs "$raw/layer_$k.safetensors" --name "$k" --tokens "$t" --stages \
        --json "$raw/bench_${k}__${v}__$r.json" >"$raw/bench_${k}__${v}__$r.log" 2>&1 ||
        { note "$layer $v round $r: bench failed"; tail -n 5 "$raw/bench_${k}__${v}__$r.log"; }
    done
  done
  if [ "${MOEKIT_PEERS:-1}" = 1 ] && ! late; then
    all="$(for v in "${variants[@]}"; do tokens_of "$v" "$k" | tr ',' '\n'; done | grep -v '^-$' | sort -nu | paste -sd,)"
    (cd "$root/.peers/vllm" && python3 bench_vllm.py --layer "$raw/layer_$k.safetensors" --dump "$raw/dump_$k.safetensors" \
      --tokens "$all" --no-ref --out "$raw/vllm_$k.json") >"$raw/vllm_$k.log" 2>&1 ||
      { note "$layer: vLLM failed"; tail -n 5 "$raw/vllm_$k.log"; }
  fi
  checks="${MOEKIT_CHECK:-}"
  for t in ${checks//,/ }; do
    late && break
    note "check $layer T=$t: $("$variants_dir/${variants[0]}/moekit" run --preset "$preset" --tokens "$t" --backend cuda \
      --skew "$skew" --check 2>&1 | tail -n 1)"
  done
  note "$layer done ($SECONDS s)"
done

python3 - "$raw" "${variants[@]}" -- "${layers[@]}" >>"$summary" <<'PY'
import glob, json, os, re, sys
raw = sys.argv[1]
cut = sys.argv.index("--")
variants, layers = sys.argv[2:cut], sys.argv[cut + 1:]
for layer in layers:
    k = re.sub(r"[^A-Za-z0-9-]", "_", layer)
    times, steps, facts, copy = {}, {}, {}, None
    for v in variants:
        for f in sorted(glob.glob(f"{raw}/bench_{k}__{v}__*.json")):
            d = json.load(open(f))
            copy = d["ceilings"]["copy_gbs"]
            for c in d["cases"]:
                times.setdefault(c["tokens"], {}).setdefault(v, []).append(c["us"])
                steps.setdefault((c["tokens"], v), c.get("graph_stages") or c.get("stages") or {})
                facts[c["tokens"]] = (c["busiest_rows"], c["empty_experts"], c["floor_us"])
    peer = {}
    if os.path.exists(f"{raw}/vllm_{k}.json"):
        for r in json.load(open(f"{raw}/vllm_{k}.json"))["results"]:
            peer[r["T"]] = (r["gemm1_plus_gemm2_us"], r["weight_gbps_gemms"], r["timings"]["pipeline"]["median_us"])
    print(f"== {layer} (copy {copy} GB/s): us per variant, each round | vLLM GEMM1+GEMM2 (weights GB/s), whole pipeline"
          " | busiest rows / empty experts, floor us")
    for t in sorted(times):
        cells = "  ".join(f"{v} " + " / ".join(f"{x:.1f}" for x in xs) for v, xs in times[t].items())
        p = peer.get(t)
        vl = f"{p[0]:.1f} ({p[1]:.0f}), {p[2]:.1f}" if p else "-"
        b = facts[t]
        print(f"T={t:<5d} {cells} | vLLM {vl} | {b[0]} / {b[1]}, {b[2]:.1f}")
    for (t, v), s in sorted(steps.items()):
        print(f"   T={t} {v}: " + " ".join(f"{n}={x:.1f}" for n, x in s.items()))
PY
# At most 8 files come back from a lent machine: the raw results in one archive.
(cd "$raw" && tar czf "$out/raw.tgz" -- *.json *.log)
echo "total $SECONDS s" >>"$summary"
cat "$summary"
