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

// Block 0 builds the plan (plan_in_block); the others quantize the input as the Prepare stage's
// fp8-block kernel does (half a warp per 1x128 group, the same arithmetic), or for bf16 copy it
// (times the weight where it goes on the input): every step in one launch, a programmatic
// dependent of the routing kernel (or of the caller's last one). Host side: run_prepared (plan.h).
template <bool kFp8>
__global__ void __launch_bounds__(kOneBlockThreads) prepare_and_plan(PrepareParams q, PlanParams plan) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  grid_dependency_wait();
  launch_dependents();
  if (blockIdx.x == 0) {
    plan_in_block(plan, shared_ints, scan_shared);
    return;
  }
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
