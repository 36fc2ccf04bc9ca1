// The whole permutation plan in one block, for decode-sized problems (plan.cu: choose_path):
// one launch instead of a memset and three dependent kernels, with the same outputs, bit for
// bit, as plan.cuh. The steps are those of the multi-kernel path, with block barriers between
// them instead of kernel boundaries and shared memory instead of the global workspace:
//   1  row_token = -1 on every row                          (the memset)
//   2  warp w counts subtile w per expert, no atomics         (count_subtiles)
//   3  thread e scans expert e's counts over the subtiles     (scan_subtiles)
//   4  block scan of the padded totals: counts, offsets, dropped
//   5  row_expert; each warp replays its subtile in slot order (assign_rows)
// A row's rank in its expert is the number of earlier slots of that expert: token order, then
// slot order, as on the multi-kernel path.
#pragma once

#include "cuda/permute/plan.cuh"

namespace moekit::cuda::permute {

constexpr int kOneBlockThreads = 1024;

// p.subtiles (NS ≤ 32) subtiles of p.pieces pieces of 32 slots, one per warp; E_local ≤
// kOneBlockThreads (thread e owns expert e in steps 3 and 4). p.subtile_counts and p.totals are
// unused. Dynamic shared memory: (E_local + 1 + NS * E_local) ints.
// The body, for any kernel whose block it owns (blockDim.x == kOneBlockThreads): shared_ints is
// the dynamic shared memory above, scan_shared 33 ints.
__device__ __forceinline__ void plan_in_block(const PlanParams& p, int* shared_ints, int* scan_shared) {
  int* offsets = shared_ints;                  // [E_local + 1] padded first rows
  int* counters = shared_ints + p.experts + 1;  // [NS, E_local] counts, then the next row of each expert
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int expert = threadIdx.x;  // steps 3 and 4
  const bool owns_expert = expert < p.experts;

  // 1. Unused and padding rows hold -1; step 5 overwrites the token rows after the barriers below.
  for (std::int64_t r = threadIdx.x; r < p.max_rows; r += blockDim.x) p.row_token[r] = -1;
  for (std::int64_t i = threadIdx.x; i < p.zeroed_count; i += blockDim.x) p.zeroed[i] = 0;

  // 2. Warp-private counters (warp-uniform branch, no block barrier inside).
  if (warp < p.subtiles) {
    int* counter = counters + warp * p.experts;
    for (int e = lane; e < p.experts; e += 32) counter[e] = 0;
    __syncwarp();
    const std::int64_t first_slot = std::int64_t(warp) * p.pieces * 32;
    for (int piece = 0; piece < p.pieces; ++piece) {
      const int e = local_expert(p, first_slot + piece * 32 + lane);
      const unsigned peers = __match_any_sync(kFullMask, e);
      if (e >= 0 && lane == __ffs(peers) - 1) counter[e] += __popc(peers);
      __syncwarp();
    }
  }
  __syncthreads();

  // 3. Counts become exclusive prefixes over the subtiles; `total` is the expert's slot count.
  int total = 0;
  if (owns_expert)
    for (int w = 0; w < p.subtiles; ++w) {
      int* c = counters + w * p.experts + expert;
      const int n = *c;
      *c = total;
      total += n;
    }

  // 4. Expert offsets; each thread's counters become the next row of its expert in each subtile.
  const int rows = owns_expert ? (p.masked ? min(total, p.capacity) : round_up_int(total, p.alignment)) : 0;
  int used = 0;
  const int first_row = block_exclusive_scan(rows, scan_shared, &used);
  if (owns_expert) {
    offsets[expert] = first_row;
    p.counts[expert] = p.masked ? rows : total;
    if (p.offsets) p.offsets[expert] = p.masked ? expert * p.capacity : first_row;
    if (!p.masked)
      for (int w = 0; w < p.subtiles; ++w) counters[w * p.experts + expert] += first_row;
  }
  if (threadIdx.x == 0) {
    offsets[p.experts] = used;
    if (p.offsets) p.offsets[p.experts] = p.masked ? p.experts * p.capacity : used;
  }
  if (p.work) {  // block-uniform: the work list, entries of at most work_rows rows
    const int pieces = owns_expert ? (total + p.work_rows - 1) / p.work_rows : 0;
    int entries = 0;
    const int first_entry = block_exclusive_scan(pieces, scan_shared, &entries);
    if (threadIdx.x == 0) p.work[0] = entries;
    for (int i = 0; i < pieces; ++i) {
      std::int32_t* w = p.work + 1 + 3 * (first_entry + i);
      w[0] = expert;
      w[1] = first_row + i * p.work_rows;
      w[2] = min(p.work_rows, total - i * p.work_rows);
    }
  }
  if (p.masked) {  // block-uniform
    int dropped = 0;
    block_exclusive_scan(owns_expert ? max(total - p.capacity, 0) : 0, scan_shared, &dropped);
    if (threadIdx.x == 0 && p.dropped) *p.dropped = dropped;
  }
  __syncthreads();

  // 5a. Local expert of every row (contiguous).
  if (p.row_expert) write_row_experts(p, offsets, threadIdx.x, blockDim.x);

  // 5b. Replay this warp's subtile in slot order.
  if (warp >= p.subtiles) return;
  replay_slots(p, std::int64_t(warp) * p.pieces * 32, counters + warp * p.experts);
}

}  // namespace moekit::cuda::permute
