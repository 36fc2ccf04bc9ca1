// Grouped GEMM instance: fp8_block, rows8_warp_mma (see sm90_grouped_gemm_instances.h).
// Decode: a few rows per group. A 64- or 128-row CUTLASS tile would be mostly padding and its
// deep TMA pipeline runs one tile per SM; here every warp streams 16 weight rows (output
// channels) of one group from memory once per 8 rows of A, with mma.sync m16n8k32 (e4m3):
// W is the 16-row operand and the group's rows the 8 columns (swap AB).
//   1. block (x, y): the y-th group that has rows; its warps take 16 channels each from x
//   2. per 64 of K, each thread loads 16 bytes of two W rows and of one A row; two MMAs use
//      them with the K order inside the 64 permuted the same way in both operands
//   3. every MMA starts from zero and its f32 sums are added per 128-K block, which then
//      enters the f32 accumulator times the two block scales, as the CPU GEMM does: the tensor
//      core never sums more than 32 products (the CUTLASS kernels: 128)
//   4. bf16 out for the rows that carry data (counts); padding rows are not written
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/check.h"
#include "cuda/gemm/warp_mma.cuh"
#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "moekit/quant.h"

namespace moekit::cuda::sm90 {
namespace {

constexpr int kWarps = 4;
constexpr int kChannelsPerWarp = 16;  // the MMA's M
constexpr int kRowsPerPass = 8;       // the MMA's N
constexpr int kLoads = 6;             // uint4 per thread per 128-K block: 2 halves x (2 W rows + 1 A row)

static_assert(kBlock == 128, "a K block is two 64-K halves of four 16-byte thread slices");

struct Params {
  const std::uint8_t* a;        // [rows, K] e4m3
  const float* a_scales;        // group e: [K/128, M_e] at offsets[e] * K/128
  const std::int32_t* offsets;  // [groups + 1]
  const std::int32_t* counts;   // [groups] rows that carry data; null: all of M_e
  const std::uint8_t* w;        // [groups, N, K] e4m3
  const float* w_scales;        // [groups, K/128, ceil(N/128)]
  __nv_bfloat16* d;             // [rows, N]
  int groups, n, k;
};

__device__ __forceinline__ int rows_of(const Params& p, int group) {
  return p.counts ? p.counts[group] : p.offsets[group + 1] - p.offsets[group];
}

// The y-th group, in order, that has rows; -1 when fewer have. One warp, no shared memory.
__device__ int nth_group_with_rows(const Params& p, int y) {
  const int lane = int(threadIdx.x % 32);
  int seen = 0;
  for (int base = 0; base < p.groups; base += 32) {
    const int g = base + lane;
    const unsigned has = __ballot_sync(~0u, g < p.groups && rows_of(p, g) > 0);
    const int here = __popc(has);
    if (seen + here > y) {
      unsigned rest = has;
      for (int skip = y - seen; skip > 0; --skip) rest &= rest - 1;
      return base + __ffs(int(rest)) - 1;
    }
    seen += here;
  }
  return -1;
}

__global__ void __launch_bounds__(kWarps * 32) rows8_warp_mma(Params p) {
  const int group = nth_group_with_rows(p, int(blockIdx.y));
  const int n0 = (int(blockIdx.x) * kWarps + int(threadIdx.x / 32)) * kChannelsPerWarp;
  if (group < 0 || n0 >= p.n) return;
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;  // MMA group id, thread in group
  const int row0 = p.offsets[group], padded = p.offsets[group + 1] - row0, rows = rows_of(p, group);
  const int k_blocks = p.k / kBlock, n_blocks = (p.n + kBlock - 1) / kBlock;
  // This thread's 16-byte slice of W rows n0 + g and n0 + g + 8 within each 64 of K.
  const std::uint8_t* w_lo = p.w + (std::size_t(group) * p.n + n0 + g) * p.k + t * 16;
  const std::uint8_t* w_hi = w_lo + std::size_t(8) * p.k;
  const float* w_scale = p.w_scales + std::size_t(group) * k_blocks * n_blocks + n0 / kBlock;
  const float* a_scale = p.a_scales + std::size_t(row0) * k_blocks;

  for (int r0 = 0; r0 < rows; r0 += kRowsPerPass) {
    const bool has_row = r0 + g < rows;  // the A row this thread loads: column g of the MMA
    const std::uint8_t* a_row = p.a + std::size_t(row0 + r0 + g) * p.k + t * 16;
    const int col = r0 + 2 * t;  // the two output rows this thread holds: col, col + 1
    auto load = [&](int kb, uint4 (&v)[kLoads]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::size_t at = std::size_t(kb) * kBlock + h * 64;
        v[3 * h] = load_streaming(w_lo + at);
        v[3 * h + 1] = load_streaming(w_hi + at);
        v[3 * h + 2] = has_row ? __ldg(reinterpret_cast<const uint4*>(a_row + at)) : make_uint4(0, 0, 0, 0);
      }
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 cur[kLoads], next[kLoads];
    load(0, cur);
    for (int kb = 0; kb < k_blocks; ++kb) {
      if (kb + 1 < k_blocks) load(kb + 1, next);
      float block[4];
      mma_block<true>({cur[0], cur[3]}, {cur[1], cur[4]}, {cur[2], cur[5]}, block);
      const float sw = w_scale[std::size_t(kb) * n_blocks];
      const float* sa = a_scale + std::size_t(kb) * padded;
      const float s0 = col < rows ? sa[col] * sw : 0.0f;
      const float s1 = col + 1 < rows ? sa[col + 1] * sw : 0.0f;
      acc[0] += s0 * block[0];
      acc[1] += s1 * block[1];
      acc[2] += s0 * block[2];
      acc[3] += s1 * block[3];
      if (kb + 1 < k_blocks)
#pragma unroll
        for (int i = 0; i < kLoads; ++i) cur[i] = next[i];
    }
    // acc: (channel n0 + g, row col), (n0 + g, col + 1), (n0 + g + 8, col), (n0 + g + 8, col + 1)
    __nv_bfloat16* out = p.d + std::size_t(row0 + col) * p.n + n0 + g;
    if (col < rows) {
      out[0] = __float2bfloat16_rn(acc[0]);
      out[8] = __float2bfloat16_rn(acc[2]);
    }
    if (col + 1 < rows) {
      out[p.n] = __float2bfloat16_rn(acc[1]);
      out[p.n + 8] = __float2bfloat16_rn(acc[3]);
    }
  }
}

}  // namespace

std::size_t fp8_block_rows8_workspace_size(const GroupedGemmDesc&) { return 0; }

Status fp8_block_rows8_can_implement(const GroupedGemmDesc& desc) {
  if (desc.k % kBlock != 0)
    return Status::no("K: the warp-MMA kernel takes whole 128-K blocks, given " + std::to_string(desc.k));
  if (desc.n % kChannelsPerWarp != 0)
    return Status::no("N: the warp-MMA kernel takes multiples of 16, given " + std::to_string(desc.n));
  return Status::ok();
}

void fp8_block_rows8_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {
  // At most this many groups have rows: one block row each (the others would only exit).
  const std::int64_t data_rows = desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  const std::int64_t busy = std::min<std::int64_t>(desc.groups, std::max<std::int64_t>(data_rows, 1));
  const Params p{static_cast<const std::uint8_t*>(args.a), args.a_scales, args.offsets, args.counts,
                 static_cast<const std::uint8_t*>(args.w), args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                 int(desc.groups), int(desc.n), int(desc.k)};
  const dim3 grid(unsigned((desc.n + kWarps * kChannelsPerWarp - 1) / (kWarps * kChannelsPerWarp)), unsigned(busy));
  rows8_warp_mma<<<grid, kWarps * 32, 0, stream>>>(p);
  MOEKIT_CUDA_CHECK_LAUNCH("rows8_warp_mma");
}

}  // namespace moekit::cuda::sm90
