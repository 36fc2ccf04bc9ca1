#!/usr/bin/env bash
# The main job: builds moekit (installing what is missing) and runs one checked forward
# pass of a model preset — on the GPU when there is one, else on the CPU.
#   scripts/run.sh [moekit run flags]   (default: --preset qwen3-30b-a3b --tokens 64 --check)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/bootstrap.sh"
"$root/scripts/build.sh" "$root/build" -DMOEKIT_BUILD_TESTS=OFF
if [ $# -eq 0 ]; then set -- --preset qwen3-30b-a3b --tokens 64 --check; fi
exec "$root/build/moekit" run "$@"
