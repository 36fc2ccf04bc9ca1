// The permutation plan and the input's preparation in one launch (plan.h: run_prepared): what
// the Prepare stage and the one-block plan do, for the staged path at decode sizes and for the
// min-latency path (cuda/layer/min_latency.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"
#include "cuda/permute/plan_one_block.cuh"
#include "cuda/quant/quantize.cuh"

namespace moekit::cuda::permute {

struct PrepareParams {
  const std::uint16_t* hidden;  // [T, H] bf16
  const float* weights;         // [T] with the weight on the input (k = 1), else null
  std::uint8_t* x;              // [T, H] e4m3, or bf16
  float* x_scales;              // [T, H / 128] (fp8)
  std::int64_t tokens;
  int hidden_size;
  bool ue8m0;
};

// The weights to prefetch (plan.h L2Prefetch): range r of expert e at base[r] + e bytes[r], cut
// into chunks[r] pieces of at most kL2Chunk; units per expert, the sum of the chunks.
inline constexpr std::int64_t kL2Chunk = 64 * 1024;
struct L2Params {
  const std::uint8_t* base[kL2Ranges];
  std::int64_t bytes[kL2Ranges];
  int chunks[kL2Ranges];
  int ranges;
  int units;        // per expert
  int first_block;  // the launch's blocks from here prefetch (gridDim.x: none)
};

__device__ __forceinline__ void prefetch_l2(const std::uint8_t* p, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// Prefetching block `block` of `blocks`, warp 0: the distinct local experts of the slots (at most
// kL2Slots, host-checked) in slot order, then unit u of the walk (expert u / units, then its ranges'
// chunks) on block u % blocks: one bulk prefetch of the chunk's whole 16-byte units.
__device__ __forceinline__ void prefetch_weights(const L2Params& l2, const PlanParams& plan, int block, int blocks) {
  __shared__ int experts[kL2Slots];
  if (threadIdx.x >= 32) return;
  const int lane = int(threadIdx.x);
  int n = 0;
  for (int first = 0; first < int(plan.slots); first += 32) {
    const int i = first + lane;
    int e = i < int(plan.slots) ? __ldg(plan.ids + i) - plan.first : -1;
    if (e >= plan.experts) e = -1;
    for (int j = 0; j < i && e >= 0; ++j)
      if (__ldg(plan.ids + j) - plan.first == e) e = -1;  // an earlier slot names it
    const unsigned found = __ballot_sync(~0u, e >= 0);
    if (e >= 0) experts[n + __popc(found & ((1u << lane) - 1))] = e;
    n += __popc(found);
  }
  __syncwarp();
  for (int u = block + lane * blocks; u < n * l2.units; u += 32 * blocks) {
    const int e = experts[u / l2.units];
    int c = u % l2.units, r = 0;
    while (c >= l2.chunks[r]) c -= l2.chunks[r++];
    const auto start = reinterpret_cast<std::uintptr_t>(l2.base[r] + e * l2.bytes[r]);
    const std::uintptr_t lo = (start + 15) / 16 * 16, hi = (start + std::uintptr_t(l2.bytes[r])) / 16 * 16;
    const std::uintptr_t at = lo + std::uintptr_t(c) * std::uintptr_t(kL2Chunk);
    if (at < hi) prefetch_l2(reinterpret_cast<const std::uint8_t*>(at), std::uint32_t(min(hi - at, std::uintptr_t(kL2Chunk))));
  }
}

// Block 0 builds the plan (plan_in_block); the next ones quantize the input as the Prepare stage's
// fp8-block kernel does (half a warp per 1x128 group, the same arithmetic), or for bf16 copy it
// (times the weight where it goes on the input); the last ones, where asked, prefetch the experts'
// weights into L2: every step in one launch, a programmatic dependent of the routing kernel (or of
// the caller's last one). Host side: run_prepared (plan.h).
template <bool kFp8>
__global__ void __launch_bounds__(kOneBlockThreads) prepare_and_plan(PrepareParams q, PlanParams plan, L2Params l2) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  grid_dependency_wait();
  launch_dependents();
  if (blockIdx.x == 0) {
    plan_in_block(plan, shared_ints, scan_shared);
    return;
  }
  if (int(blockIdx.x) >= l2.first_block) {
    prefetch_weights(l2, plan, int(blockIdx.x) - l2.first_block, int(gridDim.x) - l2.first_block);
    return;
  }
  const int groups = (q.hidden_size + 127) / 128, pairs = (groups + 1) / 2;
  const int lane = int(threadIdx.x % 32), sub = lane % 16, half = lane / 16;
  const std::int64_t warps = std::int64_t(l2.first_block - 1) * (blockDim.x / 32);
  for (std::int64_t item = std::int64_t(blockIdx.x - 1) * (blockDim.x / 32) + threadIdx.x / 32; item < q.tokens * pairs;
       item += warps) {
    const std::int64_t t = item / pairs;
    const int g = int(item % pairs) * 2 + half;
    const int col = g * 128 + sub * 8;
    const bool active = g < groups && col < q.hidden_size;  // the last pair may be short (bf16: H % 128 = 64)
    float x[8];
    unpack_bf16x8(active ? __ldg(reinterpret_cast<const uint4*>(q.hidden + t * q.hidden_size + col)) : make_uint4(0, 0, 0, 0), x);
    const float w = q.weights ? __ldg(q.weights + t) : 1.0f;
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (q.weights) x[i] = quant::prepared<true>(x[i], w);
      m = amax_step(m, x[i]);
    }
    if (!kFp8) {
      if (active) *reinterpret_cast<uint4*>(reinterpret_cast<std::uint16_t*>(q.x) + t * q.hidden_size + col) = pack_bf16x8(x);
      continue;
    }
    const float scale = fp8_scale(group_max<16>(m), q.ue8m0);
    if (active) {
      *reinterpret_cast<uint2*>(q.x + t * q.hidden_size + col) = quantize8(x, ScaleDivision(scale, true));
      if (sub == 0) q.x_scales[t * groups + g] = scale;
    }
  }
}

}  // namespace moekit::cuda::permute
