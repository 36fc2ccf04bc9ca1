#!/usr/bin/env bash
# Fuzzes moekit's parsers (docs/FUZZ.md): builds the libFuzzer targets of fuzz/ with clang,
# ASan + UBSan, CPU only, in build-fuzz/, and runs each for SECONDS (default 60) from the
# committed seed corpus. Fails on any crash, leak, timeout or out-of-memory; the input that
# caused it is left in build-fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS]     fuzz every target
#   scripts/fuzz.sh --seeds       rewrite fuzz/corpus/ with the seed maker (moekit's writers)
# MOEKIT_FUZZ_TARGETS="json layer_file" picks targets; MOEKIT_FUZZ_DIR moves the build folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${MOEKIT_FUZZ_DIR:-$root/build-fuzz}"
targets=(${MOEKIT_FUZZ_TARGETS:-safetensors json hf_checkpoint layer_file tuning_cache})

# clang and its runtime (libFuzzer, sanitizers): Debian 12 has clang 14, libclang-rt-14-dev.
if ! command -v clang++ >/dev/null 2>&1 || ! clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "fuzz: installing clang, libclang-rt-dev"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang libclang-rt-dev cmake >/dev/null
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOEKIT_FUZZ=ON -DMOEKIT_SANITIZE=ON -DMOEKIT_ENABLE_CUDA=OFF -DMOEKIT_WITH_MPI=OFF -DMOEKIT_BUILD_TESTS=OFF \
  >/dev/null
jobs="${MOEKIT_BUILD_JOBS:-$(nproc)}"

if [ "${1:-}" = "--seeds" ]; then
  cmake --build "$dir" -j "$jobs" --target fuzz_make_seeds
  rm -rf "$root/fuzz/corpus"
  "$dir/fuzz/fuzz_make_seeds" "$root/fuzz/corpus"
  echo "fuzz: wrote $root/fuzz/corpus"
  exit 0
fi

seconds="${1:-60}"
cmake --build "$dir" -j "$jobs" --target "${targets[@]/#/fuzz_}"
mkdir -p "$dir/artifacts"
status=0
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus; the committed one (seeds and reproducers) is read only.
  work="$dir/corpus/$t"
  mkdir -p "$work"
  echo "== fuzz_$t: ${seconds}s =="
  # -malloc_limit_mb: an allocation beyond what a parser of small inputs needs is a finding.
  if ! ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0" UBSAN_OPTIONS="print_stacktrace=1" \
      "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" "$work" "$root/fuzz/corpus/$t" \
      2>"$dir/fuzz_$t.log"; then
    echo "fuzz_$t: FAILED (log: $dir/fuzz_$t.log, input: $dir/artifacts/$t-*)"
    tail -n 40 "$dir/fuzz_$t.log"
    status=1
  else
    grep -E "^stat::number_of_executed_units|^#[0-9]+ +DONE" "$dir/fuzz_$t.log" | tail -n 2 || true
  fi
done
exit $status
