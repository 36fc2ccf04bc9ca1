// Finalize kernel: a block per token (grid-stride). The token's k rows and weights go to shared
// memory; each thread owns kPerThread vectors of kVec columns and walks the slots in order,
// issuing its loads of one slot together, accumulating w * x in f32 (rounded product, then add).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"

namespace moekit::cuda::finalize {

struct FinParams {
  const std::uint16_t* expert_out;  // [rows, H]
  const std::int32_t* slot_rows;    // [T, k]
  const float* weights;             // [T, k] or null
  std::uint16_t* out;               // [T, H]
  std::int64_t tokens;
  int top_k;
  int hidden;
};

template <int kVec>
__device__ __forceinline__ void load_vec(const std::uint16_t* p, float (&x)[kVec]) {
  if constexpr (kVec == 8) {
    unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(p)), x);
  } else {
    static_assert(kVec == 1, "8 columns (16 bytes) or 1");
    x[0] = bf16_to_f32(__ldg(p));
  }
}

template <int kVec>
__device__ __forceinline__ void store_vec(std::uint16_t* p, const float (&x)[kVec]) {
  if constexpr (kVec == 8) *reinterpret_cast<uint4*>(p) = pack_bf16x8(x);
  else p[0] = f32_to_bf16(x[0]);
}

template <int kVec, int kPerThread>
__global__ void __launch_bounds__(1024) finalize_tokens(FinParams p) {
  extern __shared__ float4 shared4[];
  std::int32_t* rows = reinterpret_cast<std::int32_t*>(shared4);  // [k]
  float* weights = reinterpret_cast<float*>(rows + p.top_k);      // [k]
  const int vectors = p.hidden / kVec;
  for (std::int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      rows[j] = p.slot_rows[t * p.top_k + j];
      weights[j] = p.weights ? p.weights[t * p.top_k + j] : 1.0f;
    }
    __syncthreads();
    for (int first = 0; first < vectors; first += blockDim.x * kPerThread) {
      float acc[kPerThread][kVec];
#pragma unroll
      for (int v = 0; v < kPerThread; ++v)
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[v][i] = 0.0f;
      for (int j = 0; j < p.top_k; ++j) {
        const int row = rows[j];
        if (row < 0) continue;
        const float w = weights[j];
        const std::uint16_t* src = p.expert_out + std::int64_t(row) * p.hidden;
        float x[kPerThread][kVec];
#pragma unroll
        for (int v = 0; v < kPerThread; ++v) {
          const int c = first + v * blockDim.x + threadIdx.x;
          if (c < vectors) load_vec<kVec>(src + c * kVec, x[v]);
        }
#pragma unroll
        for (int v = 0; v < kPerThread; ++v)
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[v][i] = __fadd_rn(acc[v][i], p.weights ? __fmul_rn(w, x[v][i]) : x[v][i]);
      }
#pragma unroll
      for (int v = 0; v < kPerThread; ++v) {
        const int c = first + v * blockDim.x + threadIdx.x;
        if (c < vectors) store_vec<kVec>(p.out + t * p.hidden + c * kVec, acc[v]);
      }
    }
    __syncthreads();  // rows/weights are refilled for the next token
  }
}

}  // namespace moekit::cuda::finalize
