// Routing, the input's preparation and the permutation plan in one launch (plan.h: run_prepared
// with a RoutingInLaunch), for decode's fewest tokens (T ≤ kRoutedMaxTokens): no routing launch,
// and no 1024-thread barriers in the plan.
//   block 0    stages the routing tables and routes token w on warp w (route_tokens: the routing
//              kernel's code, the same bits), writing topk_ids and topk_weights; after one block
//              barrier (the ids are this block's own global stores), warp 0 plans from them
//              (plan_in_warp), the routing's shared memory reused for its counters
//   the rest   prepare the input meanwhile (prepare_rows): nothing they read depends on routing
#include <algorithm>

#include "cuda/common/check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/permute/prepare_plan.cuh"
#include "cuda/routing/route.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::permute {
namespace {

constexpr int kRoutedThreads = 32 * int(kRoutedMaxTokens);  // a warp per token in block 0

template <typename T, int V, int W>
__global__ void __launch_bounds__(kRoutedThreads)
    route_prepare_and_plan(routing::KernelParams r, PrepareParams q, bool fp8, PlanParams plan) {
  extern __shared__ float4 shared4[];  // the routing's tables and warp scratch, then the plan's counters
  grid_dependency_wait();
  launch_dependents();
  if (blockIdx.x != 0) {
    if (fp8) prepare_rows<true>(q, int(blockIdx.x) - 1, int(gridDim.x) - 1);
    else prepare_rows<false>(q, int(blockIdx.x) - 1, int(gridDim.x) - 1);
    return;
  }
  const int warp = int(threadIdx.x / 32);
  routing::route_tokens<T, V, W>(r, reinterpret_cast<float*>(shared4), warp, kRoutedThreads / 32);
  __syncthreads();  // the ids written, the routing's shared memory free
  if (warp == 0) plan_in_warp(plan, reinterpret_cast<int*>(shared4));
}

template <typename T, int V>
void launch_scores(const RoutingInLaunch& routing, const routing::KernelParams& r, const PrepareParams& q, bool fp8,
                   const PlanParams& plan, std::size_t shared, unsigned grid, cudaStream_t stream) {
  constexpr int kVector = std::min<int>(V, 16 / int(sizeof(T)));
  const dim3 block(kRoutedThreads);
  auto launch = [&](auto kernel) { launch_dependent(kernel, dim3(grid), block, shared, stream, r, q, fp8, plan); };
  if (routing::vector_loads(routing.problem, routing.args.logits)) launch(route_prepare_and_plan<T, V, kVector>);
  else launch(route_prepare_and_plan<T, V, 1>);
}

template <typename T>
void launch_typed(const RoutingInLaunch& routing, const routing::KernelParams& r, const PrepareParams& q, bool fp8,
                  const PlanParams& plan, std::size_t shared, unsigned grid, cudaStream_t stream) {
  switch (routing::scores_per_lane(routing.problem)) {
    case 4: launch_scores<T, 4>(routing, r, q, fp8, plan, shared, grid, stream); break;
    case 8: launch_scores<T, 8>(routing, r, q, fp8, plan, shared, grid, stream); break;
    default: launch_scores<T, 16>(routing, r, q, fp8, plan, shared, grid, stream); break;
  }
}

}  // namespace

void launch_routed(const RoutingInLaunch& routing, const PrepareParams& q, bool fp8, const OneBlockLaunch& plan,
                   std::int64_t prepare_warps, cudaStream_t stream) {
  const routing::KernelParams r = routing::kernel_params(routing.problem, routing.args);
  const std::size_t shared = std::max(plan.shared, routing::block_shared_bytes(r, kRoutedThreads / 32));
  const std::int64_t preparers =
      std::clamp<std::int64_t>(ceil_div(prepare_warps, std::int64_t(kRoutedThreads / 32)), 1, multiprocessor_count() - 1);
  const unsigned grid = unsigned(1 + preparers);
  if (routing.problem.logits_dtype == DType::f32) launch_typed<float>(routing, r, q, fp8, plan.params, shared, grid, stream);
  else launch_typed<std::uint16_t>(routing, r, q, fp8, plan.params, shared, grid, stream);
  MOEKIT_CUDA_CHECK_LAUNCH("route_prepare_and_plan");
}

}  // namespace moekit::cuda::permute
