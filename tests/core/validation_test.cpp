// DESIGN §8: every public entry point validates before touching anything and throws
// moekit::Error naming the argument. Here: the config rules and the weights, each broken
// in one place on an otherwise valid layer. The call arguments are in validation_args_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "validation_util.h"

namespace moekit::test {
namespace {

// ---- Config rules: Layer's constructor (and validate) refuse the config. ----

struct ConfigCase {
  std::string name;
  QuantScheme scheme;
  std::function<void(MoEConfig&)> edit;
  std::vector<std::string> words;  // the message names the argument, and says what it was given
};
void PrintTo(const ConfigCase& c, std::ostream* os) { *os << c.name; }

class CoreValidationConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(CoreValidationConfig, ThrowsNamingTheField) {
  const ConfigCase& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(c.scheme, seed);
  // The valid config builds a layer: the edit alone makes the difference.
  ASSERT_EQ(error_of([&] { Layer ok(s.config, s.weights); }), "<no error>");
  MoEConfig bad = s.config;
  c.edit(bad);
  const std::string message = error_of([&] { Layer layer(bad, s.weights); });
  expect_mentions(message, c.words);
  EXPECT_EQ(error_of([&] { validate(bad); }), message);
}

const QuantScheme kBf16 = QuantScheme::bf16, kBlock8 = QuantScheme::fp8_block, kTensor8 = QuantScheme::fp8_tensor;
const QuantScheme kRow8 = QuantScheme::fp8_rowwise;

INSTANTIATE_TEST_SUITE_P(
    , CoreValidationConfig,
    ::testing::Values(
        ConfigCase{"top_k_zero", kBf16, [](MoEConfig& c) { c.routing.top_k = 0; }, {"top_k", "given 0"}},
        ConfigCase{"top_k_above_E", kBf16, [](MoEConfig& c) { c.routing.top_k = 7; }, {"top_k", "given 7"}},
        ConfigCase{"n_group_not_dividing_E", kBf16, [](MoEConfig& c) { c.routing.n_group = 4; }, {"n_group", "given 4"}},
        ConfigCase{"n_group_zero", kBf16, [](MoEConfig& c) { c.routing.n_group = 0; }, {"n_group", "given 0"}},
        ConfigCase{"topk_group_above_n_group", kBf16,
                   [](MoEConfig& c) { c.routing.n_group = 2, c.routing.topk_group = 3; }, {"topk_group", "given 3"}},
        ConfigCase{"top_k_above_reachable_experts", kBf16,
                   [](MoEConfig& c) {
                     c.routing.method = RoutingMethod::sigmoid_topk;
                     c.routing.n_group = 3, c.routing.topk_group = 1, c.routing.top_k = 3;
                   },
                   {"top_k", "topk_group", "given 3"}},
        ConfigCase{"ep_size_not_dividing_E", kBf16, [](MoEConfig& c) { c.ep_size = 4; }, {"ep_size", "given 4"}},
        ConfigCase{"ep_size_zero", kBf16, [](MoEConfig& c) { c.ep_size = 0; }, {"ep_size", "given 0"}},
        ConfigCase{"ep_rank_equal_to_ep_size", kBf16, [](MoEConfig& c) { c.ep_size = 2, c.ep_rank = 2; },
                   {"ep_rank", "given 2"}},
        ConfigCase{"ep_rank_negative", kBf16, [](MoEConfig& c) { c.ep_size = 2, c.ep_rank = -1; },
                   {"ep_rank", "given -1"}},
        ConfigCase{"fp8_block_I_not_multiple_of_128", kBlock8, [](MoEConfig& c) { c.intermediate_size = 96; },
                   {"intermediate_size", "128", "given 96"}},
        ConfigCase{"fp8_block_H_not_multiple_of_16", kBlock8, [](MoEConfig& c) { c.hidden_size = 136; },
                   {"hidden_size", "16", "given 136"}},
        ConfigCase{"ue8m0_with_bf16", kBf16, [](MoEConfig& c) { c.quant.scale_format = ScaleFormat::ue8m0; },
                   {"scale_format", "bf16"}},
        // bf16 layers take only the default (fast), which they ignore.
        ConfigCase{"exact_accumulation_with_bf16", kBf16,
                   [](MoEConfig& c) { c.quant.accumulation = Fp8Accumulation::exact; }, {"accumulation", "exact", "bf16"}},
        ConfigCase{"strict_accumulation_with_bf16", kBf16,
                   [](MoEConfig& c) { c.quant.accumulation = Fp8Accumulation::strict; }, {"accumulation", "strict", "bf16"}},
        ConfigCase{"batch_invariant_with_fp8_tensor", kTensor8, [](MoEConfig& c) { c.batch_invariant = true; },
                   {"batch_invariant", "fp8-tensor"}},
        ConfigCase{"top1_sigmoid_with_k2", kBf16, [](MoEConfig& c) { c.routing.method = RoutingMethod::top1_sigmoid; },
                   {"top_k", "top1_sigmoid", "given 2"}},
        ConfigCase{"input_placement_with_k2", kBf16,
                   [](MoEConfig& c) { c.routing.weight_placement = WeightPlacement::input; },
                   {"weight_placement", "given top_k 2"}},
        ConfigCase{"routed_scaling_factor_zero", kBf16, [](MoEConfig& c) { c.routing.routed_scaling_factor = 0.0f; },
                   {"routed_scaling_factor"}},
        ConfigCase{"num_experts_zero", kBf16, [](MoEConfig& c) { c.num_experts = 0; }, {"num_experts", "given 0"}},
        ConfigCase{"hidden_size_zero", kBf16, [](MoEConfig& c) { c.hidden_size = 0; }, {"hidden_size", "given 0"}},
        // Issue #19: sizes past 2^40 would overflow 2 I and the scale block counts.
        ConfigCase{"hidden_size_past_2_40", kBf16, [](MoEConfig& c) { c.hidden_size = (std::int64_t(1) << 40) + 1; },
                   {"hidden_size", "given 1099511627777"}},
        ConfigCase{"intermediate_size_huge", kBf16,
                   [](MoEConfig& c) { c.intermediate_size = std::int64_t(1) << 62; },
                   {"intermediate_size", "given 4611686018427387904"}},
        ConfigCase{"num_experts_huge", kBf16, [](MoEConfig& c) { c.num_experts = std::int64_t(1) << 50; },
                   {"num_experts", "given 1125899906842624"}},
        ConfigCase{"swiglu_limit_zero", kBf16, [](MoEConfig& c) { c.swiglu_limit = 0.0f; }, {"swiglu_limit"}}),
    [](const auto& info) { return info.param.name; });

// ---- Weights: the constructor refuses each wrong tensor. ----

struct WeightsCase {
  std::string name;
  QuantScheme scheme;
  std::function<void(Scene&)> edit;  // edits s.weights (and s.config where the case needs it)
  std::vector<std::string> words;
};
void PrintTo(const WeightsCase& c, std::ostream* os) { *os << c.name; }

class CoreValidationWeights : public ::testing::TestWithParam<WeightsCase> {};

TEST_P(CoreValidationWeights, ThrowsNamingTheTensor) {
  const WeightsCase& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(c.scheme, seed);
  ASSERT_EQ(error_of([&] { Layer ok(s.config, s.weights); }), "<no error>");
  c.edit(s);
  expect_mentions(error_of([&] { Layer layer(s.config, s.weights); }), c.words);
}

// w13 [6, W, H], w2 [6, H, I]: bf16 W=192 H=160 I=96; fp8-block W=256 H=144 I=128.
INSTANTIATE_TEST_SUITE_P(
    , CoreValidationWeights,
    ::testing::Values(
        WeightsCase{"w13_fp8_for_bf16", kBf16, [](Scene& s) { s.weights.w13 = s.make(DType::fp8_e4m3, {6, 192, 160}); },
                    {"w13", "bf16", "fp8_e4m3"}},
        WeightsCase{"w13_bf16_for_fp8", kRow8, [](Scene& s) { s.weights.w13 = s.make(DType::bf16, {6, 192, 160}); },
                    {"w13", "[6, 192, 160] fp8_e4m3", "given [6, 192, 160] bf16"}},
        WeightsCase{"w13_wrong_H", kBf16, [](Scene& s) { s.weights.w13 = s.make(DType::bf16, {6, 192, 176}); },
                    {"w13", "given [6, 192, 176]"}},
        WeightsCase{"w13_up_rows_missing", kBf16, [](Scene& s) { s.weights.w13 = s.make(DType::bf16, {6, 96, 160}); },
                    {"w13", "[6, 192, 160]"}},
        WeightsCase{"w13_absent", kBf16, [](Scene& s) { s.weights.w13 = {}; }, {"w13", "absent"}},
        WeightsCase{"w13_all_experts_on_ep_rank", kBf16, [](Scene& s) { s.config.ep_size = 2; },
                    {"w13", "[3, 192, 160]", "given [6, 192, 160]"}},
        WeightsCase{"w13_not_contiguous", kBf16,
                    [](Scene& s) {
                      TensorView v = s.weights.w13;
                      std::swap(v.strides[1], v.strides[2]);  // same shape, column-major rows
                      s.weights.w13 = v;
                    },
                    {"w13", "contiguous"}},
        WeightsCase{"w2_transposed_shape", kBf16, [](Scene& s) { s.weights.w2 = s.make(DType::bf16, {6, 96, 160}); },
                    {"w2", "[6, 160, 96]", "given [6, 96, 160]"}},
        WeightsCase{"w2_f32", kBf16, [](Scene& s) { s.weights.w2 = s.make(DType::f32, {6, 160, 96}); }, {"w2", "f32"}},
        WeightsCase{"w2_on_cuda", kBf16, [](Scene& s) { s.weights.w2.device = Device::cuda; }, {"w2", "cuda"}},
        WeightsCase{"scale_given_for_bf16", kBf16, [](Scene& s) { s.weights.w13_scale = s.make(DType::f32, {6}); },
                    {"w13_scale", "absent for bf16"}},
        WeightsCase{"tensor_w13_scale_absent", kTensor8, [](Scene& s) { s.weights.w13_scale = {}; }, {"w13_scale", "absent"}},
        WeightsCase{"tensor_w13_scale_per_row", kTensor8, [](Scene& s) { s.weights.w13_scale = s.make(DType::f32, {6, 192}); },
                    {"w13_scale", "[6] f32"}},
        WeightsCase{"tensor_w2_scale_bf16", kTensor8, [](Scene& s) { s.weights.w2_scale = s.make(DType::bf16, {6}); },
                    {"w2_scale", "f32", "bf16"}},
        WeightsCase{"rowwise_w13_scale_per_tensor", kRow8, [](Scene& s) { s.weights.w13_scale = s.make(DType::f32, {6}); },
                    {"w13_scale", "[6, 192]"}},
        WeightsCase{"rowwise_w2_scale_of_K", kRow8, [](Scene& s) { s.weights.w2_scale = s.make(DType::f32, {6, 96}); },
                    {"w2_scale", "[6, 160]", "given [6, 96]"}},
        WeightsCase{"block_w13_scale_K_blocks_floor", kBlock8,
                    [](Scene& s) { s.weights.w13_scale = s.make(DType::f32, {6, 2, 1}); },
                    {"w13_scale", "[6, 2, 2]", "given [6, 2, 1]"}},
        WeightsCase{"block_w2_scale_swapped", kBlock8, [](Scene& s) { s.weights.w2_scale = s.make(DType::f32, {6, 1, 2}); },
                    {"w2_scale", "[6, 2, 1]", "given [6, 1, 2]"}},
        WeightsCase{"block_w2_scale_absent", kBlock8, [](Scene& s) { s.weights.w2_scale = {}; }, {"w2_scale", "absent"}},
        WeightsCase{"bias_missing_for_bias_renorm", kBf16,
                    [](Scene& s) { s.config.routing.method = RoutingMethod::sigmoid_bias_renorm; },
                    {"e_score_correction_bias", "absent"}},
        WeightsCase{"bias_missing_for_bias_grouped", kRow8,
                    [](Scene& s) {
                      s.config.routing.method = RoutingMethod::sigmoid_bias_grouped;
                      s.config.routing.n_group = 3, s.config.routing.topk_group = 2;
                    },
                    {"e_score_correction_bias", "absent"}},
        WeightsCase{"bias_wrong_length", kBf16,
                    [](Scene& s) {
                      s.config.routing.method = RoutingMethod::sigmoid_bias_renorm;
                      s.weights.e_score_correction_bias = s.make(DType::f32, {7});
                    },
                    {"e_score_correction_bias", "[6]", "given [7]"}},
        WeightsCase{"bias_i32", kBf16,
                    [](Scene& s) {
                      s.config.routing.method = RoutingMethod::sigmoid_bias_renorm;
                      s.weights.e_score_correction_bias = s.make(DType::i32, {6});
                    },
                    {"e_score_correction_bias", "i32"}},
        WeightsCase{"static_scale_with_rowwise", kRow8,
                    [](Scene& s) {
                      s.weights.w13_input_scale = s.make(DType::f32, {1});
                      s.weights.w13_input_scale.ptr<float>()[0] = 0.01f;
                    },
                    {"w13_input_scale", "fp8-tensor", "fp8-rowwise"}},
        WeightsCase{"static_scale_with_bf16", kBf16,
                    [](Scene& s) {
                      s.weights.w2_input_scale = s.make(DType::f32, {1});
                      s.weights.w2_input_scale.ptr<float>()[0] = 0.01f;
                    },
                    {"w2_input_scale", "fp8-tensor", "bf16"}},
        WeightsCase{"static_scale_zero", kTensor8,
                    [](Scene& s) {
                      s.weights.w2_input_scale = s.make(DType::f32, {1});
                      s.weights.w2_input_scale.ptr<float>()[0] = 0.0f;
                    },
                    {"w2_input_scale", "> 0"}},
        WeightsCase{"static_scale_negative", kTensor8,
                    [](Scene& s) {
                      s.weights.w13_input_scale = s.make(DType::f32, {1});
                      s.weights.w13_input_scale.ptr<float>()[0] = -0.5f;
                    },
                    {"w13_input_scale", "> 0"}},
        WeightsCase{"static_scale_nan", kTensor8,
                    [](Scene& s) { s.weights.w13_input_scale = s.make(DType::f32, {1}); },  // poisoned: NaN
                    {"w13_input_scale", "> 0"}},
        WeightsCase{"static_scale_two_values", kTensor8,
                    [](Scene& s) { s.weights.w13_input_scale = s.make(DType::f32, {2}); },
                    {"w13_input_scale", "[1] f32", "given [2]"}}),
    [](const auto& info) { return info.param.name; });

// ---- Enum spellings: the parsers name the argument and list the valid values. ----

TEST(CoreValidationParse, NamesArgumentAndValidSpellings) {
  expect_mentions(error_of([] { parse_quant_scheme("fp8_block"); }), {"quant", "fp8-block", "given 'fp8_block'"});
  expect_mentions(error_of([] { parse_activation("swiglu", "--activation"); }), {"--activation", "silu_and_mul", "'swiglu'"});
  expect_mentions(error_of([] { parse_routing_method("softmax"); }), {"routing", "top1_sigmoid", "'softmax'"});
  EXPECT_EQ(parse_quant_scheme("fp8-rowwise"), QuantScheme::fp8_rowwise);
}

}  // namespace
}  // namespace moekit::test
