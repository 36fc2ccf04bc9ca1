# shellcheck shell=bash disable=SC2034  # cli is read by the script that sources this
# Sourced by the device scripts: sets `cli` to a moekit CLI for this GPU machine — the
# prebuilt one in $MOEKIT_PREBUILT (with its lib/ on LD_LIBRARY_PATH), else one built into
# $MOEKIT_BUILD_DIR (default /tmp/moekit-build; CUTLASS from .cutlass/ when present).
#   find_cli ROOT LOGDIR   (the build logs go to LOGDIR; a failed build exits the script)
find_cli() {
  local root="$1" logs="$2"
  if [ -n "${MOEKIT_PREBUILT:-}" ] && [ -x "$MOEKIT_PREBUILT/moekit" ]; then
    [ -d "$MOEKIT_PREBUILT/lib" ] && export LD_LIBRARY_PATH="$MOEKIT_PREBUILT/lib:${LD_LIBRARY_PATH:-}"
    cli="$MOEKIT_PREBUILT/moekit"
    return
  fi
  local build="${MOEKIT_BUILD_DIR:-/tmp/moekit-build}" start
  local args=(-DCMAKE_BUILD_TYPE=Release -DMOEKIT_BUILD_TESTS=OFF)
  [ -f "$root/.cutlass/include/cutlass/cutlass.h" ] && args+=(-DMOEKIT_CUTLASS_DIR="$root/.cutlass")
  command -v ninja >/dev/null && args+=(-G Ninja)
  start=$(date +%s)
  if ! cmake -S "$root" -B "$build" "${args[@]}" >"$logs/cmake.log" 2>&1 ||
     ! cmake --build "$build" -j 16 --target moekit_cli >"$logs/build.log" 2>&1; then
    tail -n 40 "$logs/cmake.log" "$logs/build.log" 2>/dev/null
    echo "BUILD FAILED"
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  cli="$build/moekit"
}
