// Routing by hand: small cases whose ids and weights were worked out on paper from DESIGN §3.
// σ(x) = 1/(1+e^-x): σ(0)=0.5, σ(1)=0.7310586, σ(-1)=0.2689414, σ(2)=0.8807971, σ(-2)=0.1192029.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "routing_test_util.h"

namespace moekit {
namespace {

using test::make_tensor;
using test::routing_config;

struct HandCase {
  std::string label;  // what the case is about; the name adds method, E, k and dtypes
  RoutingConfig config;
  std::int64_t num_experts = 0;
  std::vector<float> logits;          // [T, E]
  std::vector<float> bias;            // [E]; empty for methods without one
  std::vector<std::int32_t> ids;      // [T, k] expected
  std::vector<float> weights;         // [T, k] expected
  DType logits_dtype = DType::f32;
  DType bias_dtype = DType::f32;
};

std::string case_name(const HandCase& c) {
  std::string name = std::string(to_string(c.config.method)) + "_E" + std::to_string(c.num_experts) +
                     "_k" + std::to_string(c.config.top_k) + "_" + std::string(to_string(c.logits_dtype));
  if (!c.bias.empty()) name += "_bias" + std::string(to_string(c.bias_dtype));
  return name + "_" + c.label;
}

// gtest prints a parameter on failure; the name says more than its bytes.
void PrintTo(const HandCase& c, std::ostream* os) { *os << case_name(c); }

constexpr float kNaN = NAN;
using M = RoutingMethod;

const std::vector<HandCase>& hand_cases() {
  static const std::vector<HandCase> cases = {
      // Equal logits: every p = 1/4, the lower indices win.
      // [-4,-1,-3,-2]: p ∝ e^-3, 1, e^-2, e^-1; S = 1.553001; 1/S = 0.6439143, e^-1/S = 0.2368828.
      {"ties_negative", routing_config(M::softmax_topk, 2), 4,
       {1, 1, 1, 1, /**/ -4, -1, -3, -2}, {}, {0, 1, /**/ 1, 3}, {0.25f, 0.25f, /**/ 0.6439143f, 0.2368828f}},
      // topk of the logits, then softmax of (-1, -2): 1/(1+e^-1) = 0.7310586, 0.2689414.
      {"ties_negative", routing_config(M::topk_softmax, 2), 4,
       {2, 2, 2, 2, /**/ -4, -1, -3, -2}, {}, {0, 1, /**/ 1, 3}, {0.5f, 0.5f, /**/ 0.7310586f, 0.2689414f}},
      // Logit 2 at experts 1 and 3 (tie: 1 first), then 1 at expert 4;
      // p ∝ 1, 1, e^-1 → / (2 + e^-1): 0.4223188, 0.4223188, 0.1553624.
      // [-4,-1,-3,-2,-5]: 1, e^-1, e^-2 over 1.503215 → 0.6652410, 0.2447285, 0.0900306.
      {"ties_negative", routing_config(M::softmax_topk_renorm, 3), 5,
       {0.5f, 2, -1, 2, 1, /**/ -4, -1, -3, -2, -5}, {},
       {1, 3, 4, /**/ 1, 3, 2},
       {0.4223188f, 0.4223188f, 0.1553624f, /**/ 0.6652410f, 0.2447285f, 0.0900306f}},
      // The factor multiplies every method's weights (see src/cpu/routing.cpp):
      // 2 × (0.7310586, 0.2689414) = 1.4621172, 0.5378828.
      {"factor2", routing_config(M::softmax_topk_renorm, 2, 1, 1, 2.0f), 4,
       {-4, -1, -3, -2}, {}, {1, 3}, {1.4621172f, 0.5378828f}},
      // k = E: softmax(1, 3, 2) in the order 3, 2, 1 → 0.6652410, 0.2447285, 0.0900306.
      {"k_equals_E", routing_config(M::softmax_topk, 3), 3,
       {1, 3, 2}, {}, {1, 2, 0}, {0.6652410f, 0.2447285f, 0.0900306f}},
      // One expert: softmax of one logit is 1.
      {"single_expert", routing_config(M::softmax_topk, 1), 1, {5}, {}, {0}, {1.0f}},
      // σ: (0.5, 0.1192029, 0.7310586) → 2, 0; all negative → σ(-1), σ(-2); equal → 0, 1.
      {"ties_negative", routing_config(M::sigmoid_topk, 2), 3,
       {0, -2, 1, /**/ -3, -1, -2, /**/ 0, 0, 0}, {},
       {2, 0, /**/ 1, 2, /**/ 0, 1}, {0.7310586f, 0.5f, /**/ 0.2689414f, 0.1192029f, /**/ 0.5f, 0.5f}},
      // k = E: σ = 0.7310586, 0.5, 0.1192029, Σ = 1.3502615 → 0.5414200, 0.3702986, 0.0882814.
      {"k_equals_E", routing_config(M::sigmoid_topk_renorm, 3), 3,
       {0, -2, 1}, {}, {2, 0, 1}, {0.5414200f, 0.3702986f, 0.0882814f}},
      // σ = (0.5, 0.5, 0.7310586, 0.2689414); + bias (0.5, 0, 0, 1) = (1.0, 0.5, 0.7310586, 1.2689414):
      // the bias picks 3 then 0 over 2. Weights unbiased: (0.2689414, 0.5)/0.7689414 × 2
      // = 0.6995108, 1.3004892.
      {"bias_picks", routing_config(M::sigmoid_bias_renorm, 2, 1, 1, 2.0f), 4,
       {0, 0, 1, -1}, {0.5f, 0, 0, 1}, {3, 0}, {0.6995108f, 1.3004892f}},
      {"bias_picks", routing_config(M::sigmoid_bias_renorm, 2, 1, 1, 2.0f), 4,
       {0, 0, 1, -1}, {0.5f, 0, 0, 1}, {3, 0}, {0.6995108f, 1.3004892f}, DType::f32, DType::bf16},
      // 4 groups of 2, keep 2, factor 2.5. Token 0: σ = (.8807971 ×2, .5 ×2, .7310586 ×2,
      // .2689414 ×2); choice = σ + bias (-1,-1, 0,0, 0,0, 1,0) → group sums (-0.2384058, 1.0,
      // 1.4621172, 1.5378828). Without the bias group 0 (1.7615942) would be kept; with it
      // groups 3 and 2 are. Best choices there: 6 (1.2689414), then 4 and 5 tie at 0.7310586
      // → 4. Weights from σ, not choice: (0.2689414, 0.7310586) sum to 1 → × 2.5 = 0.6723536,
      // 1.8276464 (expert 6's choice score 1.2689 is not its weight).
      // Token 1, logits 0: choice (-.5,-.5, .5,.5, .5,.5, 1.5,.5) → group sums (-1, 1, 1, 2):
      // group 3, then groups 1 and 2 tie → 1. Choices: 6 (1.5), then 2, 3, 7 tie at .5 → 2.
      // Weights σ = .5, .5 → .5 each × 2.5 = 1.25.
      {"bias_moves_groups", routing_config(M::sigmoid_bias_grouped, 2, 4, 2, 2.5f), 8,
       {2, 2, 0, 0, 1, 1, -1, -1, /**/ 0, 0, 0, 0, 0, 0, 0, 0},
       {-1, -1, 0, 0, 0, 0, 1, 0},
       {6, 4, /**/ 6, 2}, {0.6723536f, 1.8276464f, /**/ 1.25f, 1.25f}},
      // Groups score the sum of their top 2, not their max: group 0 = σ(3) + σ(-5) = 0.9526 +
      // 0.0067 = 0.9592670 loses to group 1 = 2 σ(1) = 1.4621172, though expert 0 is the best.
      {"top2_sum_not_max", routing_config(M::sigmoid_bias_grouped, 2, 2, 1), 4,
       {3, -5, 1, 1}, {0, 0, 0, 0}, {2, 3}, {0.5f, 0.5f}},
      // argmax of the logits; weight σ(logit) = σ(2), σ(0), σ(-1).
      {"ties_negative", routing_config(M::top1_sigmoid, 1), 3,
       {0.5f, -1, 2, /**/ 0, 0, 0, /**/ -3, -1, -2}, {},
       {2, /**/ 0, /**/ 1}, {0.8807971f, /**/ 0.5f, /**/ 0.2689414f}},
      // bf16 rounds 1.001 to 1.0 (spacing 2^-7 near 1): a tie that f32 would not have, so
      // expert 0 comes first and softmax(1, 1) = 0.5, 0.5.
      {"rounding_tie", routing_config(M::topk_softmax, 2), 4,
       {1.0f, 1.001f, -2, 0.5f}, {}, {0, 1}, {0.5f, 0.5f}, DType::bf16},
      // bf16(0.3) = 154/128 × 2^-2 = 0.30078125; σ(0.30078125) = 0.5746335.
      {"rounded_weight", routing_config(M::sigmoid_topk, 1), 4,
       {0.3f, 0.2f, -1, 0.1f}, {}, {0}, {0.5746335f}, DType::bf16},
  };
  return cases;
}

class RoutingHand : public ::testing::TestWithParam<HandCase> {};

TEST_P(RoutingHand, MatchesPaper) {
  const HandCase& c = GetParam();
  const std::int64_t k = c.config.top_k;
  const auto num_tokens = std::int64_t(c.logits.size()) / c.num_experts;
  ASSERT_EQ(c.ids.size(), std::size_t(num_tokens * k)) << "case table";
  const Tensor logits = make_tensor(c.logits_dtype, {num_tokens, c.num_experts}, c.logits);
  const Tensor bias = make_tensor(c.bias_dtype, {c.num_experts}, c.bias);
  const test::Routed r = test::route_logits(c.config, logits, c.bias.empty() ? nullptr : &bias);
  EXPECT_EQ(r.ids, c.ids);
  for (std::size_t i = 0; i < c.weights.size(); ++i)
    EXPECT_NEAR(r.weights[i], c.weights[i], 1e-6 * std::max(1.0f, std::fabs(c.weights[i]))) << "slot " << i;
}

INSTANTIATE_TEST_SUITE_P(Table, RoutingHand, ::testing::ValuesIn(hand_cases()),
                         [](const auto& info) { return case_name(info.param); });

// A token with some NaN logits picks only numbers while numbers remain; an all-NaN token
// still gets ids in [0, E); the token after them routes as if it were alone.
TEST(RoutingNaN, NeverPickedWhileNumbersRemain) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  constexpr std::int64_t kE = 6;
  std::vector<float> values = {kNaN, 0.5f, kNaN, -1, 2, kNaN, /**/ kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
  for (int e = 0; e < kE; ++e) values.push_back(dist(rng));
  const Tensor bias = make_tensor(DType::f32, {kE}, std::vector<float>(kE, 0.0f));
  for (const RoutingMethod method : test::routable_methods()) {
    SCOPED_TRACE(std::string(to_string(method)));
    const int k = method == M::top1_sigmoid ? 1 : 3;
    const RoutingConfig config = method == M::sigmoid_bias_grouped ? routing_config(method, k, 3, 3)
                                                                   : routing_config(method, k);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Tensor logits = make_tensor(dtype, {3, kE}, values);
      const test::Routed all = test::route_logits(config, logits, &bias);
      const std::vector<std::int32_t> numbers_first = {4, 1, 3};  // logits 2, 0.5, -1
      EXPECT_EQ(std::vector<std::int32_t>(all.ids.begin(), all.ids.begin() + k),
                std::vector<std::int32_t>(numbers_first.begin(), numbers_first.begin() + k));
      for (int j = 0; j < k; ++j) {
        const std::int32_t id = all.ids[std::size_t(k + j)];
        EXPECT_TRUE(id >= 0 && id < kE) << "all-NaN token, slot " << j << ": " << id;
      }
      const Tensor last = make_tensor(dtype, {1, kE}, std::vector<float>(values.end() - kE, values.end()));
      const test::Routed alone = test::route_logits(config, last, &bias);
      EXPECT_EQ(std::vector<std::int32_t>(all.ids.begin() + 2 * k, all.ids.end()), alone.ids);
      const std::size_t bytes = sizeof(float) * std::size_t(k);
      EXPECT_EQ(0, std::memcmp(all.weights.data() + 2 * k, alone.weights.data(), bytes))
          << "weights of the token after the NaN ones";
    }
  }
}

}  // namespace
}  // namespace moekit
