// next_row (stepping along consecutive permuted rows) against locate_row (a search per row):
// every row of random plans, contiguous (empty experts, alignment 1 to 128) and masked
// (counts below, at and above the capacity), walked from row 0 and from random starts; contiguous
// plans also with the plan's row_expert given (locate_row and next_row then look a row's expert
// up), against the search.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/rows.cuh"
#include "cuda_test_util.h"

namespace moekit::cuda {
namespace {

// Thread t walks rows [starts[t], starts[t] + run) by p and counts rows where the walk and the
// search by `searched_by` (p without row_expert) disagree.
__global__ void walk_rows(RowsParams p, RowsParams searched_by, const int* starts, int threads, int run, int rows,
                          unsigned* mismatches) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= threads) return;
  RowInfo walked{RowKind::unused, 0, 0, 0, 0};
  for (int row = starts[t]; row < min(starts[t] + run, rows); ++row) {
    walked = row == starts[t] ? locate_row(p, row) : next_row(p, walked);
    const RowInfo searched = locate_row(searched_by, row);
    const bool same = walked.kind == searched.kind &&
                      (searched.kind == RowKind::unused ||
                       (walked.expert == searched.expert && walked.index == searched.index &&
                        walked.base == searched.base && walked.span == searched.span));
    if (!same) atomicAdd(mismatches, 1u);
  }
}

struct Plan {
  RowFormat format;
  int experts, alignment, capacity;
  std::vector<std::int32_t> counts, offsets;
  int rows;  // rows a walk covers (past the last block too)
};

Plan random_plan(RowFormat format, int experts, int alignment, std::mt19937_64& rng) {
  Plan plan{format, experts, alignment, 0, std::vector<std::int32_t>(experts), {}, 0};
  std::uniform_int_distribution<int> count(0, 40);
  for (auto& c : plan.counts) c = rng() % 3 == 0 ? 0 : count(rng);  // a third of the experts empty
  if (format == RowFormat::masked) {
    plan.capacity = 24;  // some counts exceed it
    plan.rows = experts * plan.capacity + 7;
    return plan;
  }
  plan.offsets.assign(experts + 1, 0);
  for (int e = 0; e < experts; ++e)
    plan.offsets[e + 1] = plan.offsets[e] + (plan.counts[e] + alignment - 1) / alignment * alignment;
  plan.rows = plan.offsets[experts] + 9;
  return plan;
}

TEST(CudaRows, NextRowAgreesWithLocateRowOnEveryRow) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(20261130);
  for (const RowFormat format : {RowFormat::contiguous, RowFormat::masked}) {
    for (const int experts : {1, 3, 16, 129}) {
      for (const int alignment : {1, 8, 128}) {
        const Plan plan = random_plan(format, experts, alignment, rng);
        test::DeviceArray<std::int32_t> counts(plan.counts), offsets(std::max<std::size_t>(1, plan.offsets.size()));
        if (!plan.offsets.empty()) offsets.upload(plan.offsets);
        const RowsParams searched{format, experts, alignment, plan.capacity, offsets.data(), counts.data(), nullptr};
        // The plan's row_expert: each row's expert, -1 past the rows in use (here past every row walked).
        std::vector<std::int32_t> row_expert(std::size_t(plan.rows), -1);
        if (format == RowFormat::contiguous)
          for (int e = 0; e < experts; ++e)
            for (int r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) row_expert[std::size_t(r)] = e;
        test::DeviceArray<std::int32_t> device_row_expert(row_expert);
        RowsParams looked_up = searched;
        looked_up.row_expert = device_row_expert.data();
        // One walk over everything, then many short runs from random rows.
        std::vector<int> starts{0};
        std::uniform_int_distribution<int> start(0, plan.rows - 1);
        for (int i = 0; i < 255; ++i) starts.push_back(start(rng));
        test::DeviceArray<int> device_starts(starts);
        for (const bool by_row_expert : {false, true}) {
          if (by_row_expert && format == RowFormat::masked) continue;
          const RowsParams p = by_row_expert ? looked_up : searched;
          test::DeviceArray<unsigned> mismatches(1);
          ASSERT_EQ(cudaMemset(mismatches.data(), 0, sizeof(unsigned)), cudaSuccess);
          walk_rows<<<1, 1>>>(p, searched, device_starts.data(), 1, plan.rows, plan.rows, mismatches.data());
          walk_rows<<<1, 256>>>(p, searched, device_starts.data() + 1, 255, 37, plan.rows, mismatches.data());
          ASSERT_EQ(cudaGetLastError(), cudaSuccess);
          test::sync_and_check();
          EXPECT_EQ(mismatches.download()[0], 0u) << to_string(format) << " E=" << experts << " alignment=" << alignment
                                                  << " rows=" << plan.rows << (by_row_expert ? " by row_expert" : "");
        }
      }
    }
  }
}

}  // namespace
}  // namespace moekit::cuda
