// GEMM2's weighted combine (GemmOutput::combined) after the decode kernel's tiles (the block that
// completes a column block sums every token there): a token's k rows of D summed in slot order with
// finalize's arithmetic (f32, each product rounded before the add, bf16 at the end), so the output
// has finalize's bits whichever block sums it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"

namespace moekit::cuda::combine {

// The kernels' view of GroupedGemmArgs::combined.
struct CombineOut {
  const std::int32_t* slot_rows;  // [tokens, top_k]
  const float* weights;           // [tokens, top_k] or null (every weight 1)
  std::uint16_t* out;             // [tokens, N] bf16
  std::int32_t* done;             // the kernel's counts, in its workspace
  int tokens, top_k;
};

// out[token, col .. col + 8) = sum over the token's slots j in order of w[token, j] * D[slot_rows[token,
// j], col .. col + 8). D's rows are other blocks' stores, read from L2 (the caller synchronized with
// them); the slots come 8 at a time, their loads in flight together. `out` need only be 2-byte aligned.
__device__ __forceinline__ void sum_token_columns(const CombineOut& cb, const std::uint16_t* d, int n, int token, int col) {
  constexpr int kBatch = 8;
  float acc[8] = {};
  for (int j0 = 0; j0 < cb.top_k; j0 += kBatch) {
    int row[kBatch];
    float w[kBatch];
    uint4 raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const std::size_t slot = std::size_t(token) * cb.top_k + j0 + b;
      row[b] = j0 + b < cb.top_k ? __ldg(cb.slot_rows + slot) : -1;
      w[b] = cb.weights && j0 + b < cb.top_k ? __ldg(cb.weights + slot) : 1.0f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      raw[b] = row[b] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(d + std::size_t(row[b]) * n + col)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (row[b] < 0) continue;
      float x[8];
      unpack_bf16x8(raw[b], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], cb.weights ? __fmul_rn(w[b], x[i]) : x[i]);
    }
  }
  std::uint16_t* to = cb.out + std::size_t(token) * n + col;
  if (reinterpret_cast<std::uintptr_t>(cb.out) % 16 == 0) {
    *reinterpret_cast<uint4*>(to) = pack_bf16x8(acc);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) to[i] = f32_to_bf16(acc[i]);
  }
}

}  // namespace moekit::cuda::combine
