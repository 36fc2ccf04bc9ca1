#!/usr/bin/env bash
# The Python package on a GPU machine (no registry there: python3 with torch, nanobind and
# scikit-build-core installed, CUTLASS carried as .cutlass/): builds moekit._C and the CLI from this
# source tree for that python3, runs the Python tests on CUDA (their CPU cases too), the example, and
# the torch op against `moekit bench` at T = 1 (bench/python_op_bench.py). Logs go to $OUT.
#   scripts/device-python.sh
#   MOEKIT_STEPS="build tests example bench pip"   which steps (default: all but pip, which checks
#     `pip install --no-build-isolation .` into a scratch prefix: a second, full build)
#   MOEKIT_BENCH_PRESETS="qwen3-30b-a3b deepseek-v3"   the bench's presets
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
steps="${MOEKIT_STEPS:-build tests example bench}"
build="${MOEKIT_BUILD_DIR:-/tmp/moekit-python}"
export PATH="/usr/local/cuda/bin:$PATH"
python="$(command -v python3)"
"$python" -c "import sys, torch, nanobind; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
status=0

if [[ " $steps " == *" build "* ]]; then
  cutlass=()
  [ -f "$root/.cutlass/include/cutlass/cutlass.h" ] && cutlass=(-DMOEKIT_CUTLASS_DIR="$root/.cutlass")
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  start=$(date +%s)
  if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMOEKIT_PYTHON=ON \
        -DMOEKIT_BUILD_TESTS=OFF -DPython_EXECUTABLE="$python" "${cutlass[@]}" >"$out/python-cmake.log" 2>&1 ||
     ! cmake --build "$build" -j "$(nproc)" --target _C moekit_cli >"$out/python-build.log" 2>&1; then
    tail -n 30 "$out/python-cmake.log" "$out/python-build.log"
    echo "BUILD FAILED"
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
fi
export PYTHONPATH="$build/python"

if [[ " $steps " == *" tests "* ]]; then
  echo "== pytest tests/python"
  (cd "$root/tests/python" && "$python" -m pytest -q -rs -p no:cacheprovider . 2>&1 | tee "$out/pytest.log" | tail -n 25)
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ " $steps " == *" example "* ]]; then
  echo "== examples/deepseek_v3_moe.py (small, then deepseek-v3's shapes)"
  "$python" "$root/examples/deepseek_v3_moe.py" --device cuda || status=1
  "$python" "$root/examples/deepseek_v3_moe.py" --device cuda --full --tokens 64 || status=1
fi
if [[ " $steps " == *" bench "* ]]; then
  for preset in ${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b deepseek-v3}; do
    echo "== torch op vs moekit bench: $preset"
    "$python" "$root/bench/python_op_bench.py" --cli "$build/moekit" --preset "$preset" --tokens 1 2>&1 |
      tee -a "$out/python-bench.log" || status=1
  done
fi
if [[ " $steps " == *" pip "* ]]; then
  echo "== pip install --no-build-isolation . (into /tmp/moekit-pip)"
  start=$(date +%s)
  if (cd "$root" && "$python" -m pip install --no-build-isolation --no-deps --target /tmp/moekit-pip \
        -Ccmake.define.MOEKIT_CUTLASS_DIR="$root/.cutlass" . >"$out/pip.log" 2>&1); then
    (cd /tmp && PYTHONPATH=/tmp/moekit-pip "$python" -c "import moekit; print('pip install: moekit', moekit.__version__, moekit.backend_names())")
  else
    tail -n 20 "$out/pip.log"; status=1
  fi
  echo "pip install took $(( $(date +%s) - start )) s"
fi
exit $status
