#!/usr/bin/env bash
# Decode on a GPU machine: the staged and the min-latency experts side by side (moekit bench,
# CUDA graphs, per step with --stages), and `run --check` on the min-latency path per preset; the
# presets as bf16 layers (the min-latency path's; fp8-block layers take the staged path).
#   MOEKIT_PREBUILT=DIR scripts/device-decode.sh   DIR/moekit (and DIR/lib/*.so) built elsewhere
#   MOEKIT_DECODE_TOKENS=1,2,4,8,16,32,64          the batch sizes
#   MOEKIT_DECODE_PRESETS=qwen3-30b-a3b,deepseek-v3
#   MOEKIT_DECODE_QUANT=bf16                      the layers' quant (default bf16; files get its name)
#   MOEKIT_DECODE_CHECKS="qwen3-30b-a3b:1 ..."   preset:T pairs run with --check (the CPU reference
#     of a large preset at T=64 takes a minute)
# Writes $OUT/decode_{staged,min-latency}.json and .log; prints a table last.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
bin="${MOEKIT_PREBUILT:-$root/build}"
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
tokens="${MOEKIT_DECODE_TOKENS:-1,2,4,8,16,32,64}"
presets="${MOEKIT_DECODE_PRESETS:-qwen3-30b-a3b,deepseek-v3}"
quant=(--quant "${MOEKIT_DECODE_QUANT:-bf16}")
tag="_${MOEKIT_DECODE_QUANT:-bf16}"
status=0
for path in staged min-latency; do
  echo "== moekit bench --path $path ${quant[*]}"
  if ! "$bin/moekit" bench --preset "$presets" --tokens "$tokens" --path "$path" "${quant[@]}" --stages \
       --json "$out/decode_$path$tag.json" >"$out/decode_$path$tag.log" 2>&1; then
    tail -n 5 "$out/decode_$path$tag.log"
    status=1
  fi
done
echo "== moekit run --check on the min-latency path"
for run in ${MOEKIT_DECODE_CHECKS:-qwen3-30b-a3b:1 qwen3-30b-a3b:64 deepseek-v3:1 deepseek-v3:8 minimax-m2:8 qwen3-235b-a22b:8}; do
  IFS=: read -r preset t <<<"$run"
  line=$("$bin/moekit" run --preset "$preset" --tokens "$t" --backend cuda --path min-latency "${quant[@]}" --check 2>&1 |
         grep -E "^check:|error" | tr '\n' ' ')
  echo "$preset T=$t: $line"
  [[ "$line" == *"check: PASS"* ]] || status=1
done
echo
echo "== staged vs min-latency (us, CUDA graphs)"
python3 - "$out/decode_staged$tag.json" "$out/decode_min-latency$tag.json" <<'PY'
import json, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
print("ceilings:", runs[0].get("ceilings", {}).get("copy_gbs"), "GB/s copy")
rows = {}
for i, r in enumerate(runs):
    for c in r["cases"]:
        rows.setdefault((c["preset"], c["tokens"]), [None, None])[i] = c
print(f"{'preset':16} {'T':>4} {'floor':>8} {'staged':>9} {'min-lat':>9} {'eff%':>6}  min-latency steps")
for (preset, t), (a, b) in rows.items():
    steps = " ".join(f"{k}={v:.1f}" for k, v in (b or {}).get("stages", {}).items()) if b else ""
    print(f"{preset:16} {t:>4} {a['floor_us'] if a else 0:>8.1f} {a['us'] if a else 0:>9.1f} "
          f"{b['us'] if b else 0:>9.1f} {100 * b['efficiency'] if b else 0:>6.1f}  {steps}")
PY
exit $status
