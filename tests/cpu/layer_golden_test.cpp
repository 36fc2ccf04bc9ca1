// The golden layer of DESIGN §2 (golden/layer_fp8_block_small.safetensors): E=8 k=2 H=384
// I=256, softmax_topk_renorm, silu_and_mul, fp8-block, with the routing and output an
// independent implementation computed. Fused routing must reproduce its ids exactly, its
// weights to 1e-6 and its output to 5e-3 (DESIGN §8's gate).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "io/safetensors.h"
#include "layer_util.h"

namespace moekit::test {
namespace {

TEST(CpuLayerGolden, Fp8BlockSmall) {
  const io::SafetensorsReader r(data_path("golden/layer_fp8_block_small.safetensors"));
  const auto& meta = r.metadata();
  MoEConfig config;
  config.num_experts = std::stoll(meta.at("num_experts"));
  config.hidden_size = std::stoll(meta.at("hidden_size"));
  config.intermediate_size = std::stoll(meta.at("intermediate_size"));
  config.activation = parse_activation(meta.at("activation"));
  config.quant.scheme = parse_quant_scheme(meta.at("quant"));
  config.routing.method = parse_routing_method(meta.at("routing"));
  config.routing.top_k = std::stoi(meta.at("top_k"));
  config.routing.n_group = std::stoi(meta.at("n_group"));
  config.routing.topk_group = std::stoi(meta.at("topk_group"));
  config.routing.routed_scaling_factor = std::stof(meta.at("routed_scaling_factor"));
  // The file is what the brief says it is.
  ASSERT_EQ(config.to_string(), "E=8 k=2 H=384 I=256 activation=silu_and_mul quant=fp8-block "
                                "routing=softmax_topk_renorm top_k=2");

  const Tensor hidden = r.read("hidden"), logits = r.read("router_logits");
  const Tensor w13 = r.read("w13"), w2 = r.read("w2"), w13_scale = r.read("w13_scale"), w2_scale = r.read("w2_scale");
  const Tensor want_ids = r.read("expected_topk_ids"), want_weights = r.read("expected_topk_weights");
  const Tensor want_out = r.read("expected_out");
  const std::int64_t tokens = hidden.size(0);
  ASSERT_EQ(want_out.dtype(), DType::bf16);
  ASSERT_EQ(w13.dtype(), DType::fp8_e4m3);

  Weights w;
  w.w13 = w13.view();
  w.w2 = w2.view();
  w.w13_scale = w13_scale.view();
  w.w2_scale = w2_scale.view();
  Layer layer(config, w);

  const Routing got{Tensor(DType::i32, {tokens, 2}), Tensor(DType::f32, {tokens, 2})};
  poison(got.ids.view());
  poison(got.weights.view());
  Tensor out = poisoned_out(tokens, config.hidden_size);
  layer.forward(FusedArgs{hidden.view(), logits.view(), out.view(), got.ids.view(), got.weights.view()});

  EXPECT_EQ(bit_differences(got.ids, want_ids), 0);
  for (std::int64_t i = 0; i < got.weights.numel(); ++i) {
    const float g = got.weights.ptr<float>()[i], e = want_weights.ptr<float>()[i];
    EXPECT_NEAR(g, e, 1e-6 * std::abs(e)) << "topk_weights flat index " << i;
  }
  std::vector<double> expected(std::size_t(want_out.numel()));
  for (std::int64_t i = 0; i < want_out.numel(); ++i) expected[std::size_t(i)] = bf16_to_float(want_out.ptr<bf16>()[i]);
  const double err = relative_error(out, expected);
  EXPECT_LE(err, 5e-3);
  RecordProperty("relative_error", std::to_string(err));

  // The pipeline reference agrees with the layer to the bit on the same routing.
  EXPECT_EQ(bit_differences(run_pipeline_reference(config, w, hidden, got), out), 0);
}

}  // namespace
}  // namespace moekit::test
