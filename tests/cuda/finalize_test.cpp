// CUDA finalize against cpu::finalize, bit for bit: weights present or not, -1 slots,
// H a multiple of 8 or not, T = 0 and 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/finalize.h"
#include "cuda/finalize/finalize.h"
#include "cuda_test_util.h"

namespace moekit {
namespace {

using test::DeviceArray;

TEST(CudaFinalize, MatchesTheCpuBitForBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    std::int64_t tokens;
    int top_k;
    std::int64_t hidden;
  };
  // Few tokens split their columns over blocks: parts of whole steps, the last one short ({3, 8, 4104}).
  std::vector<Shape> shapes{{0, 8, 128},   {1, 1, 128},  {1, 8, 7168},   {300, 8, 2048},
                            {257, 2, 72},  {64, 4, 13},  {40, 32, 9000}, {3, 8, 4104}};
  if (test::small_cases()) shapes = {{0, 8, 128}, {1, 1, 128}, {5, 8, 264}, {3, 2, 72}, {4, 4, 13}, {2, 8, 1032}};
  for (const Shape& s : shapes)
    for (const bool with_weights : {true, false}) {
      SCOPED_TRACE("T=" + std::to_string(s.tokens) + " k=" + std::to_string(s.top_k) + " H=" + std::to_string(s.hidden) +
                   (with_weights ? " weighted" : " unweighted"));
      // Rows: a permutation of the slots with gaps (padding rows), about 5% of slots without a row.
      const std::int64_t slots = s.tokens * s.top_k;
      const std::int64_t rows = slots + slots / 3 + 1;
      std::vector<std::int32_t> order(static_cast<std::size_t>(rows));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::int32_t> slot_rows(static_cast<std::size_t>(slots));
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (std::int64_t i = 0; i < slots; ++i) slot_rows[std::size_t(i)] = u(rng) < 0.05f ? -1 : order[std::size_t(i)];
      const std::vector<std::uint16_t> expert_out = test::random_bf16(std::size_t(rows * s.hidden), -8.0f, 8.0f, rng);
      const std::vector<float> weights = test::random_f32(std::size_t(slots), 0.0f, 1.0f, rng);

      std::vector<bf16> want(std::size_t(s.tokens * s.hidden));
      cpu::finalize({reinterpret_cast<const bf16*>(expert_out.data()), slot_rows.data(), with_weights ? weights.data() : nullptr,
                     s.tokens, s.top_k, s.hidden, want.data()});

      DeviceArray<std::uint16_t> d_expert_out(expert_out), d_out{std::size_t(s.tokens * s.hidden)};
      DeviceArray<std::int32_t> d_slot_rows(slot_rows);
      DeviceArray<float> d_weights(weights);
      d_out.poison();
      const cuda::finalize::Problem problem{s.tokens, s.top_k, s.hidden};
      ASSERT_TRUE(cuda::finalize::can_implement(problem));
      cuda::finalize::run(problem, {d_expert_out.data(), d_slot_rows.data(), with_weights ? d_weights.data() : nullptr, d_out.data()},
                          {}, nullptr);
      test::sync_and_check();
      const auto got = d_out.download();
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i].bits) << "token " << i / std::size_t(s.hidden) << " column " << i % std::size_t(s.hidden);
    }
}

}  // namespace
}  // namespace moekit
