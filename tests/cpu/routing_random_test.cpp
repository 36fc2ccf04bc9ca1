// Routing on random logits: properties that hold for any input, checked on fresh data each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "routing_test_util.h"

namespace moekit {
namespace {

using test::make_tensor;
using test::routing_config;

// Logits on a grid of 2^-10 in [-8, 8). Distinct grid values give probabilities at least
// 0.1% apart, so f32 rounding can never make two different logits tie after softmax; exact
// ties (same grid value) are ranked by index in both methods alike. Off the grid, rare
// near-ties would make topk(x) and topk(softmax(x)) disagree without either being wrong.
std::vector<float> grid_logits(std::size_t count, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> step(-8192, 8191);
  std::vector<float> v(count);
  for (float& x : v) x = float(step(rng)) / 1024.0f;
  return v;
}

// softmax_topk_renorm and topk_softmax agree in exact arithmetic (DESIGN §3): same ids, and
// weights that differ only by f32 rounding.
TEST(RoutingParity, SoftmaxTopkRenormMatchesTopkSoftmax) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const std::int64_t num_experts : {8, 60, 128, 256}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const auto num_tokens = std::uniform_int_distribution<std::int64_t>(1, 300)(rng);
      const auto k = std::uniform_int_distribution<int>(1, int(std::min<std::int64_t>(8, num_experts)))(rng);
      SCOPED_TRACE("E=" + std::to_string(num_experts) + " k=" + std::to_string(k) + " T=" +
                   std::to_string(num_tokens) + " " + std::string(to_string(dtype)));
      const Tensor logits = make_tensor(dtype, {num_tokens, num_experts},
                                        grid_logits(std::size_t(num_tokens * num_experts), rng));
      const test::Routed renorm =
          test::route_logits(routing_config(RoutingMethod::softmax_topk_renorm, k), logits);
      const test::Routed topk_first =
          test::route_logits(routing_config(RoutingMethod::topk_softmax, k), logits);
      ASSERT_EQ(renorm.ids, topk_first.ids);
      for (std::size_t i = 0; i < renorm.weights.size(); ++i)
        ASSERT_NEAR(renorm.weights[i], topk_first.weights[i], 1e-6f * std::fabs(topk_first.weights[i]))
            << "slot " << i;
    }
  }
}

// A token's routing does not depend on the other tokens of the batch, nor on how the batch
// is split among threads: each token routed alone gives the same bits.
TEST(RoutingBatch, TokenAloneMatchesTokenInBatch) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr std::int64_t kTokens = 333;
  constexpr std::int64_t kExperts = 64;
  Tensor logits(DType::bf16, {kTokens, kExperts});
  test::fill_uniform(logits, -4.0f, 4.0f, rng);
  Tensor bias(DType::f32, {kExperts});
  test::fill_uniform(bias, -0.5f, 0.5f, rng);
  for (const RoutingMethod method : test::routable_methods()) {
    SCOPED_TRACE(std::string(to_string(method)));
    const int k = method == RoutingMethod::top1_sigmoid ? 1 : 8;
    const RoutingConfig config = method == RoutingMethod::sigmoid_bias_grouped
                                     ? routing_config(method, k, 8, 4, 2.5f)
                                     : routing_config(method, k);
    const test::Routed batch = test::route_logits(config, logits, &bias);
    for (int sample = 0; sample < 8; ++sample) {
      const auto t = std::uniform_int_distribution<std::int64_t>(0, kTokens - 1)(rng);
      Tensor one(DType::bf16, {1, kExperts});
      std::memcpy(one.ptr<bf16>(), logits.ptr<bf16>() + t * kExperts, one.nbytes());
      const test::Routed alone = test::route_logits(config, one, &bias);
      const auto first = std::size_t(t * k);
      const std::vector<std::int32_t> batch_ids(batch.ids.begin() + first, batch.ids.begin() + first + k);
      EXPECT_EQ(alone.ids, batch_ids) << "token " << t;
      const std::size_t bytes = sizeof(float) * std::size_t(k);
      EXPECT_EQ(0, std::memcmp(alone.weights.data(), batch.weights.data() + first, bytes))
          << "token " << t;
    }
  }
}

// Every slot of every token is written, ids are distinct and in range, weights are finite.
TEST(RoutingBatch, EverySlotWritten) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr std::int64_t kTokens = 100;
  constexpr std::int64_t kExperts = 48;  // 6 groups of 8 for sigmoid_bias_grouped
  Tensor logits(DType::f32, {kTokens, kExperts});
  test::fill_uniform(logits, -6.0f, 6.0f, rng);
  Tensor bias(DType::bf16, {kExperts});
  test::fill_uniform(bias, -1.0f, 1.0f, rng);
  for (const RoutingMethod method : test::routable_methods()) {
    SCOPED_TRACE(std::string(to_string(method)));
    const int k = method == RoutingMethod::top1_sigmoid ? 1 : 6;
    const RoutingConfig config = method == RoutingMethod::sigmoid_bias_grouped
                                     ? routing_config(method, k, 6, 3, 2.5f)
                                     : routing_config(method, k);
    const test::Routed r = test::route_logits(config, logits, &bias);
    for (std::int64_t t = 0; t < kTokens; ++t) {
      std::vector<bool> seen(kExperts, false);
      for (int j = 0; j < k; ++j) {
        const auto slot = std::size_t(t * k + j);
        const std::int32_t id = r.ids[slot];
        ASSERT_TRUE(id >= 0 && id < kExperts) << "token " << t << " slot " << j << ": " << id;
        ASSERT_FALSE(seen[std::size_t(id)]) << "token " << t << " repeats expert " << id;
        seen[std::size_t(id)] = true;
        ASSERT_TRUE(std::isfinite(r.weights[slot])) << "token " << t << " slot " << j;
      }
    }
  }
}

TEST(RoutingBatch, NoTokens) {
  const Tensor logits(DType::f32, {0, 16});
  const test::Routed r = test::route_logits(routing_config(RoutingMethod::softmax_topk_renorm, 4), logits);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

}  // namespace
}  // namespace moekit
