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
  bool fp8;                     // e4m3 rows and their scales, else bf16 rows
  bool ue8m0;
};

// Prepares the input rows in warps' items over blocks [1, gridDim.x) as the Prepare stage's
// fp8-block kernel does (half a warp per 1x128 group, the same arithmetic), or for bf16 copies
// them (times the weight where it goes on the input).
__device__ __forceinline__ void prepare_rows(const PrepareParams& q) {
  const int groups = (q.hidden_size + 127) / 128, pairs = (groups + 1) / 2;
  const int lane = int(threadIdx.x % 32), sub = lane % 16, half = lane / 16;
  const std::int64_t warps = std::int64_t(gridDim.x - 1) * (blockDim.x / 32);
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
    if (!q.fp8) {
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

// The plan's launch with routing first in block 0 (route_plan.cu; run_prepared with a routing):
// grid blocks of kOneBlockThreads, `plan` the one-block launch whose ids are routing.args.topk_ids.
void launch_routed(const RoutingInLaunch& routing, const PrepareParams& q, const OneBlockLaunch& plan, unsigned grid,
                   cudaStream_t stream);

}  // namespace moekit::cuda::permute
