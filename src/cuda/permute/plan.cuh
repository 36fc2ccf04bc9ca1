// The permutation plan's device pieces (its kernels are in plan.cu): a stable counting sort of the slots by local expert.
//   count   each warp counts its subtile of slots per expert (warp-private shared counters;
//           __match_any_sync groups the lanes of one expert, its lowest lane adds)
//   scan    one block per expert: exclusive scan of its counts over the subtiles, and its total
//   assign  every block scans the (padded) totals into expert offsets; each warp then replays
//           its subtile in slot order, so a row's rank is the number of earlier slots of the
//           same expert: token order, then slot order, with no atomics.
// Decode-sized problems run the same steps in one block instead (plan_one_block.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rows.h"
#include "cuda/common/vec.cuh"
#include "cuda/permute/plan.h"

namespace moekit::cuda::permute {

struct PlanParams {
  const std::int32_t* ids;  // [slots]
  std::int64_t slots;       // T * k
  int top_k;
  int first;                // global id of local expert 0
  int experts;              // E_local
  int alignment;
  int capacity;             // masked
  bool masked;
  int pieces;               // 32-slot pieces per subtile
  int subtiles;             // NS
  std::int32_t* subtile_counts;  // [E_local, NS] workspace: counts, then exclusive prefixes
  std::int32_t* totals;          // [E_local] workspace
  std::int32_t* counts;
  std::int32_t* offsets;
  std::int32_t* slot_rows;
  std::int32_t* row_token;
  std::int32_t* row_expert;
  std::int32_t* dropped;
  std::int64_t max_rows;
  std::int32_t* work;  // PlanArgs::work (one_block)
  int work_rows;
  std::int32_t* zeroed;  // PlanArgs::zeroed (one_block)
  std::int64_t zeroed_count;
};

// The one-block path's parameters and dynamic shared memory (plan.cu), for kernels that run
// plan_in_block (plan_one_block.cuh) in one of their blocks.
struct OneBlockLaunch {
  PlanParams params;
  std::size_t shared;
};
OneBlockLaunch one_block_launch(const PlanProblem& problem, const PlanArgs& args);

// The local expert of slot s, or -1 (no id, another rank's expert, or past the end).
__device__ __forceinline__ int local_expert(const PlanParams& p, std::int64_t s) {
  if (s >= p.slots) return -1;
  const int e = __ldg(p.ids + s) - p.first;
  return e >= 0 && e < p.experts ? e : -1;
}

// Exclusive scan of `value` over the block (blockDim.x a multiple of 32, at most 1024); returns
// the prefix and leaves the block total in *total. `shared` holds 33 ints.
__device__ __forceinline__ int block_exclusive_scan(int value, int* shared, int* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += n;
  }
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? shared[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int n = __shfl_up_sync(kFullMask, w, d);
      if (lane >= d) w += n;
    }
    if (lane < warps) shared[lane] = w;  // inclusive over warps
    if (lane == 31) shared[32] = w;
  }
  __syncthreads();
  *total = shared[32];
  return inclusive - value + (warp > 0 ? shared[warp - 1] : 0);
}

__device__ __forceinline__ int round_up_int(int x, int m) { return (x + m - 1) / m * m; }

// Rows [first, max_rows) step `stride`: the local expert whose padded rows hold the row, -1 past
// the rows in use (offsets [E_local + 1], contiguous format).
__device__ __forceinline__ void write_row_experts(const PlanParams& p, const int* offsets, std::int64_t first,
                                                  std::int64_t stride) {
  const int used = offsets[p.experts];
  for (std::int64_t r = first; r < p.max_rows; r += stride) {
    int e = -1;
    if (r < used) {
      int lo = 0, hi = p.experts;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid;
      }
      e = lo;
    }
    p.row_expert[r] = e;
  }
}

// One warp replays p.pieces pieces of 32 slots from first_slot in slot order: a slot's row is
// next[e] (its expert's next row, advanced here) plus the same expert's slots before it in the
// piece. Writes slot_rows and row_token.
__device__ __forceinline__ void replay_slots(const PlanParams& p, std::int64_t first_slot, int* next) {
  const int lane = int(threadIdx.x & 31);
  const unsigned below = (1u << lane) - 1u;
  for (int piece = 0; piece < p.pieces; ++piece) {
    const std::int64_t s = first_slot + piece * 32 + lane;
    const int e = local_expert(p, s);
    const unsigned peers = __match_any_sync(kFullMask, e);
    const int rank = e >= 0 ? next[e] + __popc(peers & below) : 0;
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) next[e] += __popc(peers);
    if (s < p.slots) {
      int row = -1;
      if (e >= 0) row = p.masked ? (rank < p.capacity ? e * p.capacity + rank : -1) : rank;
      p.slot_rows[s] = row;
      if (row >= 0) p.row_token[row] = int(s / p.top_k);
    }
    __syncwarp();
  }
}

}  // namespace moekit::cuda::permute
