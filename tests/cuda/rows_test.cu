// locate_row with the plan's row_expert given (a row's expert looked up) against locate_row's
// search over the offsets: every row of random contiguous plans (empty experts, alignment 1 to
// 128), past the rows in use too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/rows.cuh"
#include "cuda_test_util.h"

namespace moekit::cuda {
namespace {

// Thread t compares rows [t * run, (t + 1) * run) and counts rows where the lookup by
// row_expert and the search disagree.
__global__ void compare_rows(RowsParams looked_up, RowsParams searched_by, int run, int rows, unsigned* mismatches) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  for (int row = t * run; row < min((t + 1) * run, rows); ++row) {
    const RowInfo looked = locate_row(looked_up, row);
    const RowInfo searched = locate_row(searched_by, row);
    const bool same = looked.kind == searched.kind &&
                      (searched.kind == RowKind::unused ||
                       (looked.expert == searched.expert && looked.index == searched.index &&
                        looked.base == searched.base && looked.span == searched.span));
    if (!same) atomicAdd(mismatches, 1u);
  }
}

struct Plan {
  int experts, alignment;
  std::vector<std::int32_t> counts, offsets;
  int rows;  // rows compared (past the last block too)
};

Plan random_plan(int experts, int alignment, std::mt19937_64& rng) {
  Plan plan{experts, alignment, std::vector<std::int32_t>(experts), {}, 0};
  std::uniform_int_distribution<int> count(0, 40);
  for (auto& c : plan.counts) c = rng() % 3 == 0 ? 0 : count(rng);  // a third of the experts empty
  plan.offsets.assign(experts + 1, 0);
  for (int e = 0; e < experts; ++e)
    plan.offsets[e + 1] = plan.offsets[e] + (plan.counts[e] + alignment - 1) / alignment * alignment;
  plan.rows = plan.offsets[experts] + 9;
  return plan;
}

TEST(CudaRows, RowExpertLookupAgreesWithTheSearchOnEveryRow) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = 20261130;
  std::mt19937_64 rng(seed);
  for (const int experts : {1, 3, 16, 129}) {
    for (const int alignment : {1, 8, 128}) {
      const Plan plan = random_plan(experts, alignment, rng);
      test::DeviceArray<std::int32_t> counts(plan.counts), offsets(plan.offsets);
      const RowsParams searched{RowFormat::contiguous, experts, alignment, 0, offsets.data(), counts.data(), nullptr};
      // The plan's row_expert: each row's expert, -1 past the rows in use (here past every row compared).
      std::vector<std::int32_t> row_expert(std::size_t(plan.rows), -1);
      for (int e = 0; e < experts; ++e)
        for (int r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) row_expert[std::size_t(r)] = e;
      test::DeviceArray<std::int32_t> device_row_expert(row_expert);
      RowsParams looked_up = searched;
      looked_up.row_expert = device_row_expert.data();
      test::DeviceArray<unsigned> mismatches(1);
      ASSERT_EQ(cudaMemset(mismatches.data(), 0, sizeof(unsigned)), cudaSuccess);
      compare_rows<<<4, 64>>>(looked_up, searched, (plan.rows + 255) / 256, plan.rows, mismatches.data());
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      test::sync_and_check();
      EXPECT_EQ(mismatches.download()[0], 0u) << "seed " << seed << " E=" << experts << " alignment=" << alignment
                                              << " rows=" << plan.rows;
    }
  }
}

}  // namespace
}  // namespace moekit::cuda
