// Routing against the golden vectors: an independent implementation of DESIGN §3 routed the
// same logits (tests/data/golden/routing.safetensors; see shared/golden/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>

#include "io/json.h"
#include "io/safetensors.h"
#include "moekit/error.h"
#include "routing_test_util.h"

namespace moekit {
namespace {

struct GoldenCase {
  RoutingConfig config;  // the parameters the file's `cases` metadata gives
  DType logits_dtype = DType::f32;
};

std::string key(const GoldenCase& c) {
  return std::string(to_string(c.config.method)) + "." + std::string(to_string(c.logits_dtype));
}

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << key(c); }

std::vector<GoldenCase> golden_cases() {
  using M = RoutingMethod;
  std::vector<GoldenCase> cases;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const M method : {M::softmax_topk, M::topk_softmax, M::softmax_topk_renorm, M::sigmoid_topk,
                           M::sigmoid_topk_renorm, M::sigmoid_bias_renorm})
      cases.push_back({test::routing_config(method, 8), dtype});
    cases.push_back({test::routing_config(M::sigmoid_bias_grouped, 8, 8, 4, 2.5f), dtype});  // DeepSeek-V3
    cases.push_back({test::routing_config(M::top1_sigmoid, 1), dtype});
  }
  return cases;
}

const io::SafetensorsReader& golden_file() {
  static const io::SafetensorsReader reader(test::data_path("golden/routing.safetensors"));
  return reader;
}

class RoutingGolden : public ::testing::TestWithParam<GoldenCase> {};

// The table above must say what the file says, or the comparison would test the wrong thing.
TEST_P(RoutingGolden, TableMatchesMetadata) {
  const GoldenCase& c = GetParam();
  const auto& metadata = golden_file().metadata();
  ASSERT_TRUE(metadata.count("cases")) << "no `cases` metadata";
  const io::JsonValue cases = io::parse_json(metadata.at("cases"), "routing.safetensors: cases");
  const io::JsonValue* entry = cases.get(key(c));
  ASSERT_NE(entry, nullptr) << key(c) << " missing from the metadata";
  const auto field = [&](const char* name) -> const io::JsonValue& {
    const io::JsonValue* v = entry->get(name);
    require(v != nullptr, key(c) + "." + name + " missing from the metadata");
    return *v;
  };
  EXPECT_EQ(field("top_k").as_int("top_k", 1, 1024), c.config.top_k);
  EXPECT_EQ(field("n_group").as_int("n_group", 1, 1024), c.config.n_group);
  EXPECT_EQ(field("topk_group").as_int("topk_group", 1, 1024), c.config.topk_group);
  EXPECT_EQ(field("routed_scaling_factor").as_number("routed_scaling_factor"),
            double(c.config.routed_scaling_factor));
}

TEST_P(RoutingGolden, MatchesReference) {
  const GoldenCase& c = GetParam();
  const std::string prefix = key(c) + ".";
  const Tensor logits = golden_file().read(prefix + "router_logits");
  ASSERT_EQ(logits.dtype(), c.logits_dtype);
  const Tensor bias = golden_file().read(prefix + "e_score_correction_bias");
  const Tensor want_ids = golden_file().read(prefix + "topk_ids");
  const Tensor want_weights = golden_file().read(prefix + "topk_weights");
  const test::Routed got = test::route_logits(c.config, logits, c.config.uses_bias() ? &bias : nullptr);

  const std::int64_t k = c.config.top_k;
  ASSERT_EQ(want_ids.numel(), std::int64_t(got.ids.size()));
  int mismatches = 0;
  for (std::int64_t i = 0; i < want_ids.numel() && mismatches < 10; ++i) {
    const auto slot = std::size_t(i);
    const float want = want_weights.ptr<float>()[i];
    const bool id_ok = got.ids[slot] == want_ids.ptr<std::int32_t>()[i];
    const bool weight_ok = std::fabs(got.weights[slot] - want) <= 1e-6f * std::fabs(want);
    if (id_ok && weight_ok) continue;
    ++mismatches;
    ADD_FAILURE() << "token " << i / k << " slot " << i % k << ": id " << got.ids[slot] << " weight "
                  << got.weights[slot] << ", expected id " << want_ids.ptr<std::int32_t>()[i]
                  << " weight " << want;
  }
}

INSTANTIATE_TEST_SUITE_P(File, RoutingGolden, ::testing::ValuesIn(golden_cases()), [](const auto& info) {
  return std::string(to_string(info.param.config.method)) + "_" +
         std::string(to_string(info.param.logits_dtype));
});

}  // namespace
}  // namespace moekit
