// Routing, the input's preparation and the permutation plan in one launch (plan.h: run_prepared
// with a routing), for decode sizes (T <= kRoutedMaxTokens): the routing kernel's launch and the
// plan's wait for it are gone.
//   block 0    1. stages the routing tables (stage_block) and routes token w on warp w
//                 (route_token: the routing kernel's arithmetic, the same bits), writing topk_ids
//                 and topk_weights
//              2. after a block barrier (the ids are this block's own global writes), plans from
//                 them (plan_in_block), its shared memory reused for the plan's counters
//   the rest   prepare the input meanwhile (prepare_rows): nothing they read depends on routing
#include <algorithm>

#include "cuda/common/check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/permute/prepare_plan.cuh"
#include "cuda/routing/route.cuh"

namespace moekit::cuda::permute {
namespace {

template <typename T, int V, int W>
__global__ void __launch_bounds__(kOneBlockThreads)
    route_prepare_and_plan(routing::KernelParams r, PrepareParams q, PlanParams plan) {
  extern __shared__ float4 shared4[];  // routing's tables and warp scratch, then the plan's ints
  __shared__ int scan_shared[33];
  grid_dependency_wait();
  launch_dependents();
  if (blockIdx.x != 0) {
    prepare_rows(q);
    return;
  }
  const routing::WarpScratch w = routing::stage_block(r, reinterpret_cast<float*>(shared4), false);
  routing::route_tokens<T, V, W>(r, w, threadIdx.x / 32, kOneBlockThreads / 32);
  __syncthreads();  // the ids written, the routing's shared memory free
  plan_in_block(plan, reinterpret_cast<int*>(shared4), scan_shared);
}

template <typename T, int V>
void launch_scores(const routing::KernelParams& r, bool vector, const PrepareParams& q, const OneBlockLaunch& plan,
                   std::size_t shared, unsigned grid, cudaStream_t stream) {
  constexpr int kVector = std::min<int>(V, 16 / int(sizeof(T)));
  const dim3 block(kOneBlockThreads);
  if (vector) launch_dependent(route_prepare_and_plan<T, V, kVector>, dim3(grid), block, shared, stream, r, q, plan.params);
  else launch_dependent(route_prepare_and_plan<T, V, 1>, dim3(grid), block, shared, stream, r, q, plan.params);
}

template <typename T>
void launch_typed(const RoutingInLaunch& routing, const routing::KernelParams& r, const PrepareParams& q,
                  const OneBlockLaunch& plan, std::size_t shared, unsigned grid, cudaStream_t stream) {
  const bool vector = routing::vector_loads(routing.problem, routing.args.logits);
  switch (routing::scores_per_lane(routing.problem)) {
    case 4: launch_scores<T, 4>(r, vector, q, plan, shared, grid, stream); break;
    case 8: launch_scores<T, 8>(r, vector, q, plan, shared, grid, stream); break;
    default: launch_scores<T, 16>(r, vector, q, plan, shared, grid, stream); break;
  }
}

}  // namespace

void launch_routed(const RoutingInLaunch& routing, const PrepareParams& q, const OneBlockLaunch& plan, unsigned grid,
                   cudaStream_t stream) {
  const routing::KernelParams r = routing::kernel_params(routing.problem, routing.args);
  const int warps = int(std::min<std::int64_t>(routing.problem.tokens, kOneBlockThreads / 32));
  const std::size_t shared = std::max(plan.shared, routing::block_shared_bytes(r, warps));
  if (routing.problem.logits_dtype == DType::f32) launch_typed<float>(routing, r, q, plan, shared, grid, stream);
  else launch_typed<std::uint16_t>(routing, r, q, plan, shared, grid, stream);
  MOEKIT_CUDA_CHECK_LAUNCH("route_prepare_and_plan");
}

}  // namespace moekit::cuda::permute
