#!/usr/bin/env bash
# Source variants side by side in one device call: the tree as it is, then each patch of
# MOEKIT_AB_PATCHES (a folder of *.patch files, `patch -p1` from the repository root, applied one at
# a time to the tree and reverted after), each built in the same build folder (only what a patch
# touches is rebuilt) and timed by `moekit bench --inputs --stages` on the presets' T=4096 layer files
# at MOEKIT_AB_TOKENS. A table last: the layer under CUDA graphs and each eager step, per variant.
#   MOEKIT_AB_PATCHES=ab   MOEKIT_AB_PRESETS=qwen3-30b-a3b,deepseek-v3   MOEKIT_AB_TOKENS=1,8
#   carry: .cutlass (no registry there)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
patches="${MOEKIT_AB_PATCHES:-$root/ab}"
tokens="${MOEKIT_AB_TOKENS:-1,8}"
IFS=',' read -r -a presets <<<"${MOEKIT_AB_PRESETS:-qwen3-30b-a3b,deepseek-v3}"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
build="${MOEKIT_BUILD_DIR:-/tmp/moekit-ab}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUTLASS_DIR="$root/.cutlass" >"$out/build.log" 2>&1 ||
  { tail -n 20 "$out/build.log"; exit 1; }
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"

# Builds the CLI; times the layer on each preset's file into $out/ab_<variant>_<preset>.json.
run_variant() {
  local name="$1" start=$SECONDS
  if ! cmake --build "$build" -j 16 --target moekit_cli >>"$out/build.log" 2>&1; then
    grep -E "error" "$out/build.log" | head -n 20
    echo "$name: BUILD FAILED"
    return 1
  fi
  echo "== $name built in $((SECONDS - start)) s"
  for preset in "${presets[@]}"; do
    local layer="/tmp/ab_layer_$preset.safetensors"
    [ -f "$layer" ] || timeout 200 "$build/moekit" run --preset "$preset" --tokens 4096 --backend cuda --save-layer "$layer" \
      >/dev/null 2>&1
    timeout 150 "$build/moekit" bench --inputs "$layer" --tokens "$tokens" --stages --json "$out/ab_${name}_$preset.json" \
      >"$out/ab_${name}_$preset.log" 2>&1 || echo "$name $preset: bench failed"
  done
}

# patch -p1 where the machine has it, else git apply (outside a repository too).
apply() {
  if command -v patch >/dev/null; then (cd "$root" && patch -p1 --quiet "${@:2}" <"$1")
  else (cd "$root" && git apply "${@:2}" "$1"); fi
}

variants=(base)
run_variant base
for patch in "$patches"/*.patch; do
  [ -f "$patch" ] || continue
  name="$(basename "$patch" .patch)"
  if ! apply "$patch"; then
    echo "$name: does not apply"
    continue
  fi
  run_variant "$name" && variants+=("$name")
  apply "$patch" -R
done

echo "== summary (us: the layer under CUDA graphs; eager steps; steps in graph replays)"
python3 - "$out" "${variants[@]}" <<'PY'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
for name in names:
    for f in sorted(os.listdir(out)):
        if not (f.startswith(f"ab_{name}_") and f.endswith(".json")):
            continue
        preset = f[len(f"ab_{name}_"):-5]
        for c in json.load(open(os.path.join(out, f)))["cases"]:
            steps = " ".join(f"{k}={v:.1f}" for k, v in (c.get("stages") or {}).items())
            print(f"{name:12s} {preset:14s} T={c['tokens']:<5d} {c['us']:8.1f} us  {steps}")
            graph = " ".join(f"{k}={v:.1f}" for k, v in (c.get("graph_stages") or {}).items())
            if graph:
                print(f"{'':12s} {'':14s} {'':7s} {'':8s}    graph: {graph}")
PY
# At most 8 files come back from a lent machine: everything in one archive.
(cd "$out" && tar czf ab.tgz --remove-files -- ab_* build.log 2>/dev/null)
