#include "io/hf_config.h"

#include <gtest/gtest.h>

#include "moekit/error.h"

namespace moekit::io {
namespace {

const std::string kSizes = R"("hidden_size":64,"moe_intermediate_size":128,"num_experts":16,"num_experts_per_tok":4)";

HfModelConfig parse(const std::string& extra_keys) {
  return parse_hf_config(parse_json("{" + kSizes + extra_keys + "}", "config.json"), "config.json");
}

struct RoutingCase {
  const char* name;
  std::string keys;
  bool has_bias;
  RoutingMethod method;
  int n_group;
};

void PrintTo(const RoutingCase& c, std::ostream* os) { *os << c.name; }

class IoHfRouting : public ::testing::TestWithParam<RoutingCase> {};

TEST_P(IoHfRouting, MapsToMethod) {
  const RoutingCase& c = GetParam();
  const RoutingConfig r = hf_routing(parse(c.keys), c.has_bias);
  EXPECT_EQ(r.method, c.method) << to_string(r.method);
  EXPECT_EQ(r.n_group, c.n_group);
  EXPECT_EQ(r.top_k, 4);
}

INSTANTIATE_TEST_SUITE_P(
    , IoHfRouting,
    ::testing::Values(
        RoutingCase{"DeepseekV3", R"(,"scoring_func":"sigmoid","topk_method":"noaux_tc","n_group":4,"topk_group":2)",
                    true, RoutingMethod::sigmoid_bias_grouped, 4},
        RoutingCase{"MinimaxM2", R"(,"scoring_func":"sigmoid","n_group":null)", true, RoutingMethod::sigmoid_bias_renorm, 1},
        RoutingCase{"SigmoidBiasOneGroup", R"(,"scoring_func":"sigmoid","n_group":1,"topk_group":1)", true,
                    RoutingMethod::sigmoid_bias_renorm, 1},
        RoutingCase{"SigmoidRenorm", R"(,"scoring_func":"sigmoid","norm_topk_prob":true)", false,
                    RoutingMethod::sigmoid_topk_renorm, 1},
        RoutingCase{"Sigmoid", R"(,"scoring_func":"sigmoid")", false, RoutingMethod::sigmoid_topk, 1},
        RoutingCase{"Qwen3", R"(,"model_type":"qwen3_moe","norm_topk_prob":true)", false,
                    RoutingMethod::softmax_topk_renorm, 1},
        RoutingCase{"Qwen2NoRenorm", R"(,"model_type":"qwen2_moe","norm_topk_prob":false)", false,
                    RoutingMethod::softmax_topk, 1},
        RoutingCase{"Mixtral", R"(,"model_type":"mixtral")", false, RoutingMethod::topk_softmax, 1},
        RoutingCase{"ExplicitSoftmaxMixtral", R"(,"model_type":"mixtral","scoring_func":"softmax")", false,
                    RoutingMethod::softmax_topk, 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(IoHfConfig, ReadsSizesAndExtras) {
  const HfModelConfig hf = parse(
      R"(,"routed_scaling_factor":2.5,"num_hidden_layers":61,"hidden_act":"silu",)"
      R"("quantization_config":{"quant_method":"fp8","weight_block_size":[128,128],"scale_fmt":"ue8m0"})");
  EXPECT_EQ(hf.hidden_size, 64);
  EXPECT_EQ(hf.moe_intermediate_size, 128);
  EXPECT_EQ(hf.num_experts, 16);
  EXPECT_EQ(hf.top_k, 4);
  EXPECT_EQ(hf.routed_scaling_factor, 2.5f);
  EXPECT_EQ(hf.num_hidden_layers, 61);
  EXPECT_EQ(hf.scale_format, ScaleFormat::ue8m0);
  EXPECT_EQ(hf.activation, Activation::silu_and_mul);
}

TEST(IoHfConfig, MultimodalTextConfigIsUsed) {
  const HfModelConfig hf = parse_hf_config(
      parse_json(R"({"model_type":"llama4","text_config":{)" + kSizes + R"(,"model_type":"llama4_text"}})", "c"), "c");
  EXPECT_EQ(hf.hidden_size, 64);
  EXPECT_EQ(hf.model_type, "llama4_text");
}

TEST(IoHfConfig, BadValuesNameTheKey) {
  for (const auto& [keys, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"(,"scoring_func":"relu")", "scoring_func"},
           {R"(,"hidden_act":"relu")", "hidden_act"},
           {R"(,"norm_topk_prob":1)", "norm_topk_prob"},
           {R"(,"n_group":0)", "n_group"},
           {R"(,"quantization_config":{"quant_method":"fp8","scale_fmt":"e5m2"})", "scale_fmt"}}) {
    try {
      parse(keys);
      ADD_FAILURE() << "accepted " << keys;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace moekit::io
