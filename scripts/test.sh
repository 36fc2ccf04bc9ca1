#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test twice —
# a Release build (with CUDA when nvcc exists; GPU tests skip without a GPU) with the Python
# extension in it (MOEKIT_PYTHON=ON: pytest tests/python imports it from build/python, the CUDA
# library is not built twice), and an
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU code — then fuzzes each
# parser for MOEKIT_FUZZ_SECONDS (default 60; 0 skips) with clang's libFuzzer (scripts/fuzz.sh).
# The random tests use one fixed seed (MOEKIT_TEST_SEED, default below); ctest includes the
# 200-case CPU smoke of `moekit fuzz` (cli_fuzz_smoke).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/bootstrap.sh" --tests
# Fixed seeds in CI: every test that draws random data draws it from this seed (tests/test_util.h
# fresh_seed), so a CI run is reproducible; the device scripts draw a fresh one per run.
export MOEKIT_TEST_SEED="${MOEKIT_TEST_SEED:-20261201}"
echo "== test seed MOEKIT_TEST_SEED=$MOEKIT_TEST_SEED"

echo "== release build =="
"$root/scripts/build.sh" "$root/build" -DMOEKIT_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
(cd "$root/build" && ctest --output-on-failure -j "$(nproc)")
echo "== python tests (tests/python, moekit from build/python) =="
(cd "$root/tests/python" && PYTHONPATH="$root/build/python" python3 -m pytest -q -rs -p no:cacheprovider .)

echo "== sanitizer build (ASan + UBSan, CPU code) =="
"$root/scripts/build.sh" "$root/build-asan" -DMOEKIT_SANITIZE=ON -DMOEKIT_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$(nproc)")

fuzz_seconds="${MOEKIT_FUZZ_SECONDS:-60}"
if [ "$fuzz_seconds" != "0" ]; then
  echo "== fuzzing (libFuzzer, ASan + UBSan, ${fuzz_seconds}s per parser) =="
  "$root/scripts/fuzz.sh" "$fuzz_seconds"
fi
