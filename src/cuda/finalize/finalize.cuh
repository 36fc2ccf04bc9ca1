// Finalize kernel: a block per token (grid-stride) and column split: a few tokens (decode) spread
// their columns over gridDim.y blocks, so that more SMs load their rows at once. The token's k rows
// and weights go to shared memory; each thread owns kPerThread vectors of kVec columns, loads them
// for kBatch slots at once, then accumulates w * x in slot order in f32 (rounded product, then add).
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

// Raw storage of kVec bf16 columns.
template <int kVec> struct Raw;
template <> struct Raw<8> { using type = uint4; };
template <> struct Raw<1> { using type = unsigned short; };

template <int kVec>
__device__ __forceinline__ void unpack(const typename Raw<kVec>::type& raw, float (&x)[kVec]) {
  if constexpr (kVec == 8) unpack_bf16x8(raw, x);
  else x[0] = bf16_to_f32(raw);
}

template <int kVec>
__device__ __forceinline__ void store_vec(std::uint16_t* p, const float (&x)[kVec]) {
  if constexpr (kVec == 8) *reinterpret_cast<uint4*>(p) = pack_bf16x8(x);
  else p[0] = f32_to_bf16(x[0]);
}

// Slots are read kBatch at a time (all their loads in flight), then added in slot order.
template <int kVec, int kPerThread, int kBatch>
__global__ void __launch_bounds__(512) finalize_tokens(FinParams p) {
  using R = typename Raw<kVec>::type;
  extern __shared__ float4 shared4[];
  std::int32_t* rows = reinterpret_cast<std::int32_t*>(shared4);  // [k]
  float* weights = reinterpret_cast<float*>(rows + p.top_k);      // [k]
  const int vectors = p.hidden / kVec;
  // This block's columns: the blockIdx.y-th of gridDim.y equal parts, whole kPerThread x threads steps.
  const int step = int(blockDim.x) * kPerThread;
  const int part = (vectors + step * int(gridDim.y) - 1) / (step * int(gridDim.y)) * step;
  const int begin = int(blockIdx.y) * part, end = min(vectors, begin + part);
  for (std::int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      rows[j] = p.slot_rows[t * p.top_k + j];
      weights[j] = p.weights ? p.weights[t * p.top_k + j] : 1.0f;
    }
    __syncthreads();
    for (int first = begin; first < end; first += step) {
      float acc[kPerThread][kVec];
#pragma unroll
      for (int v = 0; v < kPerThread; ++v)
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[v][i] = 0.0f;
      for (int j0 = 0; j0 < p.top_k; j0 += kBatch) {
        R raw[kBatch][kPerThread];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int row = j0 + b < p.top_k ? rows[j0 + b] : -1;
          const std::uint16_t* src = p.expert_out + std::int64_t(row) * p.hidden;
#pragma unroll
          for (int v = 0; v < kPerThread; ++v) {
            const int c = first + v * blockDim.x + threadIdx.x;
            raw[b][v] = row >= 0 && c < end ? __ldg(reinterpret_cast<const R*>(src + c * kVec)) : R{};
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j0 + b >= p.top_k || rows[j0 + b] < 0) continue;
          const float w = weights[j0 + b];
#pragma unroll
          for (int v = 0; v < kPerThread; ++v) {
            float x[kVec];
            unpack<kVec>(raw[b][v], x);
#pragma unroll
            for (int i = 0; i < kVec; ++i) acc[v][i] = __fadd_rn(acc[v][i], p.weights ? __fmul_rn(w, x[i]) : x[i]);
          }
        }
      }
#pragma unroll
      for (int v = 0; v < kPerThread; ++v) {
        const int c = first + v * blockDim.x + threadIdx.x;
        if (c < end) store_vec<kVec>(p.out + t * p.hidden + c * kVec, acc[v]);
      }
    }
    __syncthreads();  // rows/weights are refilled for the next token
  }
}

}  // namespace moekit::cuda::finalize
