// Evicting the L2 between timed runs (`moekit tune`, bench/grouped_gemm_bench), so that a run
// streams its weights from HBM as the layer does after other layers' work.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace moekit::cuda {

// Reads `bytes` (a multiple of 16, more than the L2) of device memory at `buffer` on `stream`.
// Reads leave the L2 full of clean lines: the next kernel's loads meet no write-backs, which a
// memset's dirty lines cost decode kernels (2-8 µs, docs/perf-log/decode.md, nineteenth session).
void evict_l2(const void* buffer, std::size_t bytes, cudaStream_t stream);

}  // namespace moekit::cuda
