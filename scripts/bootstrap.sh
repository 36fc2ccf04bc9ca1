#!/usr/bin/env bash
# Installs what moekit's build needs when it is missing (idempotent): a C++20 compiler,
# CMake, and with --tests GoogleTest and Open MPI (the expert-parallel tests run under mpirun).
# CUDA is used when nvcc is found (PATH or /usr/local/cuda); it is not installed, but CUTLASS's
# headers are (pip), unless MOEKIT_CUTLASS_DIR names a copy (for machines without a registry).
# With --tests also what the Python tests need, for the python3 on PATH (pip): torch (PyPI's build,
# which runs on CPUs too), pytest, numpy, nanobind.
#   scripts/bootstrap.sh [--tests]
set -euo pipefail
with_tests=0
[ "${1:-}" = "--tests" ] && with_tests=1

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
if [ $with_tests -eq 1 ]; then
  [ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
  command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
  command -v mpicxx >/dev/null 2>&1 || need+=(libopenmpi-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}"
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
# CUTLASS 4.2's headers, for the CUDA build only (skipped when MOEKIT_CUTLASS_DIR is set).
if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } && [ -z "${MOEKIT_CUTLASS_DIR:-}" ]; then
  if ! python3 -c "import cutlass_library" >/dev/null 2>&1; then
    echo "bootstrap: installing nvidia-cutlass==4.2.0.0 (headers)"
    python3 -m pip install -q --no-deps nvidia-cutlass==4.2.0.0
  fi
fi
# cuobjdump and nvdisasm, for the SASS check of the WGMMA kernels (ctest sass_uniform_wgmma), where
# the CUDA toolkit lacks them: PyPI's wheels (scripts/sass_uniform.py finds them there).
if [ $with_tests -eq 1 ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  for tool in cuobjdump nvdisasm; do
    if ! command -v $tool >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/$tool ] &&
       ! python3 -c "import glob, nvidia, sys; sys.exit(not any(glob.glob(p + '/cu*/bin/$tool') for p in nvidia.__path__))" >/dev/null 2>&1; then
      echo "bootstrap: installing nvidia-cuda-$tool==13.2.51 (pip)"
      python3 -m pip install -q --no-deps nvidia-cuda-$tool==13.2.51
    fi
  done
fi
# The Python tests (tests/python): the extension is built by the same CMake build (MOEKIT_PYTHON=ON).
if [ $with_tests -eq 1 ] && ! python3 -c "import torch, pytest, numpy, nanobind" >/dev/null 2>&1; then
  echo "bootstrap: installing torch==2.11.0 pytest numpy nanobind (pip)"
  python3 -m pip install -q torch==2.11.0 pytest numpy nanobind
fi
