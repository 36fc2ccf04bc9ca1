// Permutation plan kernels: a stable counting sort of the slots by local expert.
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

// The local expert of slot s, or -1 (no id, another rank's expert, or past the end).
__device__ __forceinline__ int local_expert(const PlanParams& p, std::int64_t s) {
  if (s >= p.slots) return -1;
  const int e = __ldg(p.ids + s) - p.first;
  return e >= 0 && e < p.experts ? e : -1;
}

__global__ void __launch_bounds__(256) count_subtiles(PlanParams p) {
  extern __shared__ int shared_counts[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int subtile = blockIdx.x * (blockDim.x / 32) + warp;
  if (subtile >= p.subtiles) return;  // warp-uniform; no block barrier below
  int* counter = shared_counts + warp * p.experts;
  for (int e = lane; e < p.experts; e += 32) counter[e] = 0;
  __syncwarp();
  const std::int64_t first_slot = std::int64_t(subtile) * p.pieces * 32;
  for (int piece = 0; piece < p.pieces; ++piece) {
    const int e = local_expert(p, first_slot + piece * 32 + lane);
    const unsigned peers = __match_any_sync(kFullMask, e);
    if (e >= 0 && lane == __ffs(peers) - 1) counter[e] += __popc(peers);
    __syncwarp();
  }
  for (int e = lane; e < p.experts; e += 32) p.subtile_counts[std::int64_t(e) * p.subtiles + subtile] = counter[e];
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

__global__ void __launch_bounds__(256) scan_subtiles(PlanParams p) {
  __shared__ int shared[33];
  const int e = blockIdx.x;
  std::int32_t* row = p.subtile_counts + std::int64_t(e) * p.subtiles;
  int carry = 0;
  for (int base = 0; base < p.subtiles; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const int value = i < p.subtiles ? row[i] : 0;
    int chunk = 0;
    const int prefix = block_exclusive_scan(value, shared, &chunk);
    if (i < p.subtiles) row[i] = carry + prefix;
    carry += chunk;
  }
  if (threadIdx.x == 0) p.totals[e] = carry;
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

__global__ void __launch_bounds__(256) assign_rows(PlanParams p) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  int* offsets = shared_ints;                 // [E_local + 1] padded first rows
  int* running = shared_ints + p.experts + 1;  // [warps, E_local] next row of each expert
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;

  // Expert offsets from the totals (every block, redundantly: E_local values).
  int carry = 0, dropped = 0;
  for (int base = 0; base < p.experts; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int total = e < p.experts ? p.totals[e] : 0;
    const int rows = p.masked ? min(total, p.capacity) : round_up_int(total, p.alignment);
    int chunk = 0;
    const int prefix = block_exclusive_scan(rows, scan_shared, &chunk);
    if (e < p.experts) {
      offsets[e] = carry + prefix;
      if (blockIdx.x == 0) {
        p.counts[e] = p.masked ? rows : total;
        if (p.offsets) p.offsets[e] = p.masked ? e * p.capacity : carry + prefix;
      }
    }
    carry += chunk;
    if (p.masked) {
      int over = 0;
      block_exclusive_scan(e < p.experts ? max(total - p.capacity, 0) : 0, scan_shared, &over);
      dropped += over;
    }
  }
  if (threadIdx.x == 0) {
    offsets[p.experts] = carry;
    if (blockIdx.x == 0) {
      if (p.offsets) p.offsets[p.experts] = p.masked ? p.experts * p.capacity : carry;
      if (p.masked && p.dropped) *p.dropped = dropped;
    }
  }
  __syncthreads();

  // Local expert of every row (contiguous), grid-stride.
  if (p.row_expert)
    write_row_experts(p, offsets, std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                      std::int64_t(gridDim.x) * blockDim.x);

  // Replay this warp's subtile in slot order.
  const int subtile = blockIdx.x * warps + warp;
  if (subtile >= p.subtiles) return;
  int* next = running + warp * p.experts;
  for (int e = lane; e < p.experts; e += 32)
    next[e] = p.subtile_counts[std::int64_t(e) * p.subtiles + subtile] + (p.masked ? 0 : offsets[e]);
  __syncwarp();
  replay_slots(p, std::int64_t(subtile) * p.pieces * 32, next);
}

}  // namespace moekit::cuda::permute
