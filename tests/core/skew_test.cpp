// Skewed routing (src/core/skew.h): the spec's grammar, a bias that is a pure function of the
// seed, and that every preset's routing method, fed the biased logits, puts its rows on few
// experts (zipf) or on the hot ones (hot), where the same logits unbiased spread them.
#include "core/skew.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/synthetic.h"
#include "io/presets.h"
#include "moekit/error.h"
#include "moekit/routing.h"
#include "test_util.h"

namespace moekit::core {
namespace {

TEST(CoreSkew, ParsesEachFormAndPrintsItBack) {
  for (const char* spec : {"none", "zipf:1.2", "zipf:0", "zipf:100", "hot:8:4", "hot:1:-2.5", "hot:256:100"})
    EXPECT_EQ(parse_router_skew(spec, "--skew").to_string(), spec);
  const RouterSkew z = parse_router_skew("zipf:1.25");
  EXPECT_EQ(z.kind, SkewKind::zipf);
  EXPECT_EQ(z.alpha, 1.25);
  const RouterSkew h = parse_router_skew("hot:16:8");
  EXPECT_EQ(h.kind, SkewKind::hot);
  EXPECT_EQ(h.hot, 16);
  EXPECT_EQ(h.boost, 8.0);
}

struct BadSpec {
  const char* name;
  const char* spec;
};

class CoreSkewBadSpec : public ::testing::TestWithParam<BadSpec> {};

TEST_P(CoreSkewBadSpec, IsAnErrorNamingTheArgumentAndTheForms) {
  const std::string spec = GetParam().spec;
  try {
    parse_router_skew(spec, "--skew");
    FAIL() << "accepted '" << spec << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("--skew: ", 0), 0u) << m;
    EXPECT_NE(m.find("expected none, zipf:ALPHA"), std::string::npos) << m;
    EXPECT_NE(m.find("given '" + spec + "'"), std::string::npos) << m;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CoreSkewBadSpec,
    ::testing::Values(BadSpec{"empty", ""}, BadSpec{"unknown", "uniform"}, BadSpec{"upper_case", "ZIPF:1"},
                      BadSpec{"none_with_value", "none:1"}, BadSpec{"zipf_no_alpha", "zipf"},
                      BadSpec{"zipf_empty_alpha", "zipf:"}, BadSpec{"zipf_word", "zipf:x"},
                      BadSpec{"zipf_negative", "zipf:-1"}, BadSpec{"zipf_plus", "zipf:+1"},
                      BadSpec{"zipf_space", "zipf: 1"}, BadSpec{"zipf_trailing", "zipf:1x"},
                      BadSpec{"zipf_nan", "zipf:nan"}, BadSpec{"zipf_inf", "zipf:inf"},
                      BadSpec{"zipf_too_large", "zipf:101"}, BadSpec{"zipf_two_numbers", "zipf:1:2"},
                      BadSpec{"hot_no_bias", "hot:8"}, BadSpec{"hot_zero", "hot:0:4"}, BadSpec{"hot_negative", "hot:-1:4"},
                      BadSpec{"hot_fraction", "hot:1.5:4"}, BadSpec{"hot_bad_bias", "hot:8:x"},
                      BadSpec{"hot_bias_too_large", "hot:8:1e3"}, BadSpec{"hot_extra", "hot:8:4:1"}),
    [](const ::testing::TestParamInfo<BadSpec>& info) { return std::string(info.param.name); });

TEST(CoreSkew, HotMoreExpertsThanTheLayerIsAnErrorNamingTheArgument) {
  EXPECT_NO_THROW(router_skew_bias(parse_router_skew("hot:8:1"), 8, 1, "--skew"));
  try {
    router_skew_bias(parse_router_skew("hot:9:1"), 8, 1, "--skew");
    FAIL() << "hot:9 on 8 experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--skew: hot:9:... biases more experts than the layer's 8"), std::string::npos)
        << e.what();
  }
}

TEST(CoreSkew, RanksAreASeededPermutationThatIsNotTheIdentity) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (std::int64_t experts : {1, 2, 8, 128, 256}) {
    const std::vector<std::int64_t> rank = skew_ranks(experts, seed);
    std::vector<std::int64_t> sorted = rank;
    std::sort(sorted.begin(), sorted.end());
    for (std::int64_t e = 0; e < experts; ++e) ASSERT_EQ(sorted[std::size_t(e)], e) << "E=" << experts;
    EXPECT_EQ(rank, skew_ranks(experts, seed)) << "E=" << experts;
  }
  // 256 experts: the identity, or the same order from another seed, has odds of 1/256!.
  const std::vector<std::int64_t> rank = skew_ranks(256, seed);
  std::vector<std::int64_t> identity(256);
  for (std::size_t e = 0; e < identity.size(); ++e) identity[e] = std::int64_t(e);
  EXPECT_NE(rank, identity);
  EXPECT_NE(rank, skew_ranks(256, seed + 1));
}

TEST(CoreSkew, BiasIsTheFormulaOfEachExpertsRank) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::int64_t> rank = skew_ranks(64, seed);
  const std::vector<float> zipf = router_skew_bias(parse_router_skew("zipf:1.5"), 64, seed);
  const std::vector<float> hot = router_skew_bias(parse_router_skew("hot:5:3"), 64, seed);
  ASSERT_EQ(zipf.size(), 64u);
  ASSERT_EQ(hot.size(), 64u);
  int hot_experts = 0;
  for (std::size_t e = 0; e < 64; ++e) {
    EXPECT_EQ(zipf[e], float(-1.5 * std::log(double(rank[e] + 1)))) << e;
    EXPECT_EQ(hot[e], rank[e] < 5 ? 3.0f : 0.0f) << e;
    hot_experts += hot[e] != 0.0f;
  }
  EXPECT_EQ(hot_experts, 5);
  EXPECT_TRUE(router_skew_bias(RouterSkew{}, 64, seed).empty());
}

// Same seed, same biased logits (bit for bit); no skew leaves the generated logits untouched.
TEST(CoreSkew, BiasedLogitsAreAPureFunctionOfTheSeedAndNoSkewChangesNothing) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor plain = make_router_logits(33, 48, dtype, seed);
    Tensor a = make_router_logits(33, 48, dtype, seed), b = make_router_logits(33, 48, dtype, seed);
    add_router_bias(a.view(), router_skew_bias(parse_router_skew("none"), 48, seed));
    EXPECT_EQ(std::memcmp(a.view().data, plain.view().data, a.nbytes()), 0);
    const std::vector<float> bias = router_skew_bias(parse_router_skew("zipf:1.2"), 48, seed);
    add_router_bias(a.view(), bias);
    add_router_bias(b.view(), router_skew_bias(parse_router_skew("zipf:1.2"), 48, seed));
    EXPECT_EQ(std::memcmp(a.view().data, b.view().data, a.nbytes()), 0);
    EXPECT_NE(std::memcmp(a.view().data, plain.view().data, a.nbytes()), 0);
    if (dtype != DType::f32) continue;
    for (std::int64_t i = 0; i < a.numel(); ++i)
      ASSERT_EQ(a.ptr<float>()[i], plain.ptr<float>()[i] + bias[std::size_t(i % 48)]) << i;
  }
}

TEST(CoreSkew, RoutingLoadCountsRowsBusiestAndEmptyExperts) {
  Tensor ids(DType::i32, {3, 2});
  const std::int32_t values[] = {2, 0, 2, -1, 2, 5};  // -1 dropped, 5 outside E=4
  std::memcpy(ids.view().data, values, sizeof values);
  const RoutingLoad load = routing_load(ids.view(), 4);
  EXPECT_EQ(load.rows, 4);
  EXPECT_EQ(load.busiest, 3);
  EXPECT_EQ(load.busiest_expert, 2);
  EXPECT_EQ(load.empty, 2);
  EXPECT_EQ(load.to_string(), "E=4 rows=4 busiest=3 (expert 2, 3.0x the mean 1.0) empty=2");
}

// Every preset's routing method (softmax, renormalized softmax, DeepSeek-V3's grouped sigmoid with
// its bias, MiniMax-M2's, Llama-4's top-1) on the same logits with and without the skew.
class CoreSkewRouting : public ::testing::TestWithParam<const char*> {
 protected:
  static constexpr std::int64_t kTokens = 1024;

  struct Routed {
    RoutingLoad load;
    Tensor ids;
  };
  Routed route_with(const std::string& spec, std::uint64_t seed) const {
    const MoEConfig c = io::find_preset(GetParam()).config;
    Tensor logits = make_router_logits(kTokens, c.num_experts, DType::f32, seed);
    add_router_bias(logits.view(), router_skew_bias(parse_router_skew(spec), c.num_experts, seed));
    Tensor correction(DType::f32, {c.num_experts});  // e_score_correction_bias: small, as trained ones are
    for (std::int64_t e = 0; e < c.num_experts; ++e) correction.ptr<float>()[e] = 0.01f * float(e % 7);
    Routed r{{}, Tensor(DType::i32, {kTokens, c.top_k()})};
    Tensor weights(DType::f32, {kTokens, c.top_k()});
    test::poison(r.ids.view());
    route(c.routing, {logits.view(), c.routing.uses_bias() ? correction.view() : TensorView{}},
          {r.ids.view(), weights.view()});
    r.load = routing_load(r.ids.view(), c.num_experts);
    return r;
  }
};

TEST_P(CoreSkewRouting, ZipfPutsTheRowsOnAFewExpertsAndEmptiesMost) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = io::find_preset(GetParam()).config;
  const Routed plain = route_with("none", seed), skewed = route_with("zipf:8", seed);
  ASSERT_EQ(plain.load.rows, kTokens * c.top_k());
  ASSERT_EQ(skewed.load.rows, kTokens * c.top_k());
  // Unbiased N(0, 1) logits spread the rows: no expert near every token, none empty.
  EXPECT_LT(plain.load.busiest, kTokens / 2) << plain.load.to_string();
  EXPECT_EQ(plain.load.empty, 0) << plain.load.to_string();
  // zipf:8: the expert of rank 0 is in (almost) every token's top k, most experts in none.
  EXPECT_GE(skewed.load.busiest, kTokens * 9 / 10) << skewed.load.to_string();
  EXPECT_GE(double(skewed.load.busiest), 3.5 * skewed.load.mean()) << skewed.load.to_string();
  EXPECT_GE(skewed.load.empty, c.num_experts / 2) << skewed.load.to_string();
  // The expert of rank 0 is in nearly every token's top k (with k > 1 the next ranks, or with the
  // sigmoid methods cold experts of a large correction bias, may tie with it as the busiest).
  const std::vector<std::int64_t> rank = skew_ranks(c.num_experts, seed);
  std::int64_t rank0_rows = 0;
  for (std::int64_t i = 0; i < skewed.ids.numel(); ++i) rank0_rows += rank[std::size_t(skewed.ids.ptr<std::int32_t>()[i])] == 0;
  EXPECT_GE(rank0_rows, kTokens * 9 / 10) << skewed.load.to_string();
}

TEST_P(CoreSkewRouting, HotPutsTheRowsOnTheHotExperts) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = io::find_preset(GetParam()).config;
  const std::int64_t n = std::min<std::int64_t>(2 * c.top_k(), c.num_experts / 2);
  const std::string spec = "hot:" + std::to_string(n) + ":8";
  const std::vector<std::int64_t> rank = skew_ranks(c.num_experts, seed);
  for (const std::string& s : {std::string("none"), spec}) {
    const Routed r = route_with(s, seed);
    std::int64_t on_hot = 0;
    for (std::int64_t i = 0; i < r.ids.numel(); ++i) on_hot += rank[std::size_t(r.ids.ptr<std::int32_t>()[i])] < n;
    const double share = double(on_hot) / double(r.load.rows);
    if (s == "none") EXPECT_LT(share, 0.75) << s << ": " << r.load.to_string();
    // DeepSeek-V3's groups: a group of one hot expert can outscore one of two (its second expert
    // and the correction bias), so a few tokens take a cold expert there.
    else EXPECT_GE(share, 0.95) << s << ": " << r.load.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CoreSkewRouting,
                         ::testing::Values("deepseek-v3", "qwen3-30b-a3b", "minimax-m2", "llama4-scout", "gpt-oss-120b",
                                           "mixtral-8x7b"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           std::replace(s.begin(), s.end(), '.', '_');
                           return s;
                         });

}  // namespace
}  // namespace moekit::core
