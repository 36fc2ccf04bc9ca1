// Gather kernel: a block of 8 warps handles 8 consecutive output rows, a warp per row.
//   1. locate the row (expert, index, token | padding | unused)
//   2. copy the row's bytes with 16-byte vectors (4 loads in flight per lane), or zeros
//   3. scales: k-major rows copy straight; MN-major goes through shared memory so the 8
//      rows' scales of one K block are written as one contiguous run
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "moekit/config.h"

namespace moekit::cuda::permute {

constexpr int kGatherRows = 8;     // rows (warps) per block
constexpr int kScaleChunk = 64;    // K blocks staged per pass (MN-major)

struct GatherParams {
  RowsParams rows;
  const void* q;
  const float* scales;
  const std::int32_t* row_token;
  void* out_q;
  float* out_scales;
  std::int64_t max_rows;
  int row_bytes;
  int groups;        // scale groups per row: ceil(H/128) block, 1 rowwise, 0 tensor / bf16
  QuantScheme scheme;
  ScaleLayout layout;
};

template <int kBytes> struct VectorOf;
template <> struct VectorOf<16> { using type = uint4; };
template <> struct VectorOf<8> { using type = uint2; };
template <> struct VectorOf<4> { using type = unsigned int; };
template <> struct VectorOf<2> { using type = unsigned short; };
template <> struct VectorOf<1> { using type = unsigned char; };

// Copies (or zero-fills, src == null) `count` vectors; kUnroll loads in flight per lane.
template <int kBytes>
__device__ __forceinline__ void copy_row(const void* src, void* dst, int count, int lane) {
  using V = typename VectorOf<kBytes>::type;
  constexpr int kUnroll = 4;
  const V* s = static_cast<const V*>(src);
  V* d = static_cast<V*>(dst);
  int c = lane;
  for (; c + 32 * (kUnroll - 1) < count; c += 32 * kUnroll) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s ? __ldg(s + c + 32 * u) : V{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[c + 32 * u] = v[u];
  }
  for (; c < count; c += 32) d[c] = s ? __ldg(s + c) : V{};
}

template <int kBytes>
__global__ void __launch_bounds__(kGatherRows * 32) gather_rows(GatherParams p) {
  __shared__ float staged[kGatherRows][kScaleChunk + 1];
  __shared__ RowInfo infos[kGatherRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const std::int64_t row64 = std::int64_t(blockIdx.x) * kGatherRows + warp;
  const int row = int(row64);
  RowInfo info{RowKind::unused, 0, 0, 0, 0};
  if (row64 < p.max_rows) info = locate_row(p.rows, row);
  const int token = info.kind == RowKind::token ? __ldg(p.row_token + row) : -1;
  if (lane == 0) infos[warp] = info;

  if (info.kind != RowKind::unused) {
    const char* src = token >= 0 ? static_cast<const char*>(p.q) + std::int64_t(token) * p.row_bytes : nullptr;
    copy_row<kBytes>(src, static_cast<char*>(p.out_q) + std::int64_t(row) * p.row_bytes, p.row_bytes / kBytes, lane);
    if (p.groups > 0 && (p.scheme == QuantScheme::fp8_rowwise || p.layout == ScaleLayout::k_major)) {
      for (int g = lane; g < p.groups; g += 32)
        p.out_scales[std::int64_t(row) * p.groups + g] = token >= 0 ? __ldg(p.scales + std::int64_t(token) * p.groups + g) : 0.0f;
    }
  }
  if (p.scheme == QuantScheme::fp8_tensor && blockIdx.x == 0 && threadIdx.x == 0) p.out_scales[0] = __ldg(p.scales);
  if (p.scheme != QuantScheme::fp8_block || p.layout != ScaleLayout::mn_major_per_expert) return;

  // MN-major: stage [rows, chunk of K blocks], then write K block by K block, rows fastest.
  __syncthreads();
  for (int g0 = 0; g0 < p.groups; g0 += kScaleChunk) {
    const int n = min(kScaleChunk, p.groups - g0);
    for (int g = lane; g < n; g += 32)
      staged[warp][g] = token >= 0 ? __ldg(p.scales + std::int64_t(token) * p.groups + g0 + g) : 0.0f;
    __syncthreads();
    for (int i = threadIdx.x; i < n * kGatherRows; i += blockDim.x) {
      const int r = i % kGatherRows, g = i / kGatherRows;
      const RowInfo& ri = infos[r];
      if (ri.kind == RowKind::unused) continue;
      const int out_row = int(std::int64_t(blockIdx.x) * kGatherRows + r);
      p.out_scales[scale_index(ScaleLayout::mn_major_per_expert, ri, out_row, g0 + g, p.groups)] = staged[r][g];
    }
    __syncthreads();
  }
}

}  // namespace moekit::cuda::permute
