// Warp-level FP8 MMA pieces shared by the decode kernels (rows8_warp_mma, the min-latency
// layer): 16 weight rows (output channels) are the MMA's M, 8 rows of activations its N (swap AB),
// one 128-K block is two 64-K halves of four 16-byte slices per thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit::cuda {

__device__ __forceinline__ std::uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// d = a (16x32, row) x b (32x8, col), from zero, f32.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f), "f"(0.0f), "f"(0.0f),
        "f"(0.0f));
}

// 16 bytes read once (weights): no L1 allocation.
__device__ __forceinline__ uint4 load_streaming(const std::uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// d = a (16x16, row) x b (16x8, col), from zero, bf16 operands, f32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f), "f"(0.0f), "f"(0.0f),
        "f"(0.0f));
}

// One 128-byte K block of a 16-channel strip times 8 rows: w_lo/w_hi hold channel rows g and
// g + 8 (g = lane / 4) and x row g, each [half] the 16 bytes at offset half * 64 + (lane % 4) * 16.
// Each half's four words feed two MMAs (kFp8: m16n8k32 e4m3, 128 of K; else m16n8k16 bf16, 64 of
// K), words 2q and 2q + 1 of both operands: logical column c of an e4m3 MMA is byte
// (c % 16) / 4 * 16 + 8q + (c >= 16) * 4 + c % 4 of the half, of a bf16 one the k pairs 2t and
// 2t + 8 — the same permutation in both operands, so it cancels. Each MMA sums from zero; their
// f32 results are added in order. sums: (channel g, row 2t), (g, 2t + 1), (g + 8, 2t),
// (g + 8, 2t + 1), t = lane % 4.
template <bool kFp8>
__device__ __forceinline__ void mma_block(const uint4 (&w_lo)[2], const uint4 (&w_hi)[2], const uint4 (&x)[2],
                                          float (&sums)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) sums[i] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const std::uint32_t wa[4] = {word(w_lo[h], 2 * q), word(w_hi[h], 2 * q), word(w_lo[h], 2 * q + 1),
                                   word(w_hi[h], 2 * q + 1)};
      const std::uint32_t xb[2] = {word(x[h], 2 * q), word(x[h], 2 * q + 1)};
      float part[4];
      if constexpr (kFp8) mma_e4m3(part, wa, xb);
      else mma_bf16(part, wa, xb);
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[i] += part[i];
    }
}

}  // namespace moekit::cuda
