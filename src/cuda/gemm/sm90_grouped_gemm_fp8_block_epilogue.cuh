// moekit's FP8 block-scaled persistent kernel (sm90_grouped_gemm_fp8_block.cuh): a tile's outputs.
// Its math warps hold a 128-row tile as two warpgroups of 64 rows, acc in WGMMA's layout; they write
//   bf16 rows          store_staged: through two per-warp staging buffers, by TMA bulk stores (or
//                      lane by lane, whole rows' 16-byte sectors, for a group's last rows)
//   activated FP8 rows store_activated: GEMM1's gate and up halves activated and quantized 1x128 in
//                      registers, FP8 rows and their scales in GEMM2's layout
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_block {

using namespace wgmma;

constexpr int kStagingBytes = 16 * 64;  // a warp's staging buffer: 16 rows x 32 bf16 columns of output

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

// Bulk async stores of D (bf16 [rows, N]) in boxes of 16 rows x 32 columns from a warp's staging
// buffer, laid out in the map's 64-byte swizzle; columns past N are clipped. One lane issues, commits
// and waits (bulk groups are per thread).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, std::uint32_t src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<std::uint64_t>(map)),
               "r"(src), "r"(col), "r"(row)
               : "memory");
}
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {  // the older groups have read their buffers
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// A warp's 16 rows of a bf16 tile out: rows [row, row + 16) of the tile (local), kN columns from
// t.n0, acc as the WGMMA left it (acc[i]: row lane / 4 (i % 4 < 2) or + 8, column 8 (i / 4) + 2 (lane
// % 4) + i % 2). 32 columns at a time go through one of the warp's two staging buffers (stmatrix: 16
// rows of 64 bytes, the 16-byte chunks swizzled by row so that neither side conflicts: TMA's 64-byte
// swizzle). With map_d, where the 16 rows all carry data, a bulk store takes the buffer to D while
// the next 32 columns fill the other; else (no map, or a group's last rows) each lane stores 16
// bytes, whole sectors of a row, of the rows that carry data. Columns past N are not written.
template <int kN>
__device__ __forceinline__ void store_staged(const Params& p, const CUtensorMap* map_d, const Tile& t,
                                             const float (&acc)[kN / 2], int row, std::uint8_t* staging) {
  const int lane = int(threadIdx.x % 32);
  const bool bulk = map_d != nullptr && t.m0 + row + 16 <= t.rows;
  if (map_d != nullptr) {  // the last tile's stores have read both buffers
    if (lane == 0) tma_store_wait_read<0>();
    __syncwarp();
  }
  // stmatrix x4: lane l gives row l % 8 of matrix l / 8 (rows 8 (m % 2) + l % 8, 8 columns 8 (m / 2))
  const int s_row = 8 * ((lane / 8) % 2) + lane % 8, s_chunk = lane / 16;
#pragma unroll
  for (int c0 = 0; c0 < kN; c0 += 32) {
    if (t.n0 + c0 >= p.n) break;
    std::uint8_t* buffer = staging + (c0 / 32 % 2) * kStagingBytes;
    if (bulk && c0 >= 64) {  // the store two steps back has read this buffer
      if (lane == 0) tma_store_wait_read<1>();
      __syncwarp();
    }
    const std::uint32_t buf = smem_address(buffer);
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
    if (bulk) {  // every lane's writes visible to the async proxy, then one lane stores the box
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      if (lane == 0) tma_store(map_d, buf, t.n0 + c0, t.row0 + t.m0 + row);
      continue;
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 2; ++it) {  // 16 rows x 4 chunks of 16 bytes
      const int r = (lane + 32 * it) / 4, chunk = lane % 4;
      const uint4 v = *reinterpret_cast<const uint4*>(buffer + r * 64 + ((chunk ^ (r / 2 % 4)) * 16));
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
