#!/usr/bin/env bash
# Configures and builds moekit into a build folder: scripts/build.sh [DIR] [cmake args...]
# MOEKIT_CUTLASS_DIR (a CUTLASS root) and MOEKIT_BUILD_JOBS are passed on when set.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/build}"
shift || true
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
extra=()
[ -n "${MOEKIT_CUTLASS_DIR:-}" ] && extra+=(-DMOEKIT_CUTLASS_DIR="$MOEKIT_CUTLASS_DIR")
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" "$@" >/dev/null
cmake --build "$dir" -j "${MOEKIT_BUILD_JOBS:-$(nproc)}"
