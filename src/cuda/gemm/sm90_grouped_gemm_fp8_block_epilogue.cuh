// moekit's FP8 block-scaled persistent kernel (sm90_grouped_gemm_fp8_block.cuh): a tile's outputs.
// Its math warps hold a 128-row tile as two warpgroups of 64 rows, acc in WGMMA's layout; they write
//   bf16 rows          store_staged: through a per-warp staging buffer, whole rows' 16-byte sectors
//   activated FP8 rows store_activated: GEMM1's gate and up halves activated and quantized 1x128 in
//                      registers, FP8 rows and their scales in GEMM2's layout
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_block {

using namespace wgmma;

// GEMM1's activated FP8 output (kN 256 with an activation): q [rows, I], scales in GEMM2's layout
// (group e's [I/128, padded] at offsets[e] * I/128, rows contiguous).
struct ActOut {
  std::uint8_t* q;
  float* scales;
  int inter;
  float alpha, limit;
  bool ue8m0;
};

__device__ __forceinline__ std::uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// A warp's 16 rows of a bf16 tile out: rows [row, row + 16) of the tile (local), kN columns from
// t.n0, acc as the WGMMA left it (acc[i]: row lane / 4 (i % 4 < 2) or + 8, column 8 (i / 4) + 2 (lane
// % 4) + i % 2). 32 columns at a time go through the warp's staging buffer (stmatrix: 16 rows of 64
// bytes, the 16-byte chunks swizzled by row so that neither side conflicts), then each lane stores
// 16 bytes: whole sectors of a row. Rows past the group's data and columns past N are not written.
template <int kN>
__device__ __forceinline__ void store_staged(const Params& p, const Tile& t, const float (&acc)[kN / 2], int row,
                                             std::uint8_t* staging) {
  const int lane = int(threadIdx.x % 32);
  const std::uint32_t buf = smem_address(staging);
  // stmatrix x4: lane l gives row l % 8 of matrix l / 8 (rows 8 (m % 2) + l % 8, 8 columns 8 (m / 2))
  const int s_row = 8 * ((lane / 8) % 2) + lane % 8, s_chunk = lane / 16;
#pragma unroll
  for (int c0 = 0; c0 < kN; c0 += 32) {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {  // columns c0 + 16 pair + [0, 16): accumulator groups j, j + 1
      const int j = c0 / 8 + 2 * pair;
      const int chunk = 2 * pair + s_chunk;
      const std::uint32_t at = buf + std::uint32_t(s_row * 64 + ((chunk ^ (s_row / 2 % 4)) * 16));
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at),
                   "r"(bf16x2_bits(acc[4 * j], acc[4 * j + 1])), "r"(bf16x2_bits(acc[4 * j + 2], acc[4 * j + 3])),
                   "r"(bf16x2_bits(acc[4 * j + 4], acc[4 * j + 5])), "r"(bf16x2_bits(acc[4 * j + 6], acc[4 * j + 7]))
                   : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 2; ++it) {  // 16 rows x 4 chunks of 16 bytes
      const int r = (lane + 32 * it) / 4, chunk = lane % 4;
      const uint4 v = *reinterpret_cast<const uint4*>(staging + r * 64 + ((chunk ^ (r / 2 % 4)) * 16));
      const int col = t.n0 + c0 + 8 * chunk;
      if (t.m0 + row + r < t.rows && col < p.n)
        *reinterpret_cast<uint4*>(p.d + (std::size_t(t.row0) + t.m0 + row + r) * p.n + col) = v;
    }
    __syncwarp();
  }
}

// GEMM1's activated rows lo and lo + 8 of the tile (gate and up accumulators of the same 64 x 128
// channels): each row's 128 channels are one 1x128 block, held by the 4 lanes of a quad. gate is
// overwritten by the activated values.
template <Activation kAct>
__device__ __forceinline__ void store_activated(const Params& p, const ActOut& out, const Tile& t, float (&gate)[64],
                                                const float (&up)[64], int lo) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float m = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // 8 values at a time: 4 column groups of 8, 2 values each
      float g[8], u[8], x[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = 4 * (4 * c + i / 2) + 2 * half + i % 2;
        g[i] = round_to_bf16(gate[r]);
        u[i] = round_to_bf16(up[r]);
      }
      activation::activate_values<kAct>(g, u, out.alpha, out.limit, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        gate[4 * (4 * c + i / 2) + 2 * half + i % 2] = x[i];
        m = amax_step(m, x[i]);
      }
    }
    const float scale = fp8_scale(group_max<4>(m), out.ue8m0);
    const int row = lo + 8 * half;
    if (row >= t.rows) continue;
    const ScaleDivision division(scale, true);
    std::uint8_t* q = out.q + (std::size_t(t.row0) + row) * out.inter + t.n0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<std::uint16_t*>(q + 8 * j) = fp8x2(division(gate[4 * j + 2 * half]), division(gate[4 * j + 2 * half + 1]));
    if (lane % 4 == 0)
      out.scales[std::size_t(t.row0) * (out.inter / kTileK) + std::size_t(t.n0 / kTileK) * t.padded + row] = scale;
  }
}

}  // namespace moekit::cuda::sm90::fp8_block
