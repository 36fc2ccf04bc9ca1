// The golden layer of DESIGN §2 (golden/layer_fp8_block_small.safetensors): E=8 k=2 H=384
// I=256, softmax_topk_renorm, silu_and_mul, fp8-block, with the routing and output an
// independent implementation computed. Fused routing must reproduce its ids exactly, its
// weights to 1e-6 and its output to 5e-3 (DESIGN §8's gate). Read with io::read_layer_file.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "io/layer_file.h"
#include "io/safetensors.h"
#include "layer_util.h"

namespace moekit::test {
namespace {

TEST(CpuLayerGolden, Fp8BlockSmall) {
  const io::LayerFile file = io::read_layer_file(data_path("golden/layer_fp8_block_small.safetensors"));
  const MoEConfig& config = file.config;
  // The file is what DESIGN §2 says it is.
  ASSERT_EQ(config.to_string(), "E=8 k=2 H=384 I=256 activation=silu_and_mul quant=fp8-block (fast accumulation) "
                                "routing=softmax_topk_renorm top_k=2");
  const Tensor& hidden = file.hidden;
  const Tensor& logits = file.router_logits;
  const Tensor& want_ids = file.extra.at("expected_topk_ids");
  const Tensor& want_weights = file.extra.at("expected_topk_weights");
  const Tensor& want_out = file.extra.at("expected_out");
  const std::int64_t tokens = hidden.size(0);
  ASSERT_EQ(want_out.dtype(), DType::bf16);
  ASSERT_EQ(file.w13.dtype(), DType::fp8_e4m3);

  // The same tensors as the plain safetensors reader sees them.
  const io::SafetensorsReader r(data_path("golden/layer_fp8_block_small.safetensors"));
  const Tensor raw_w13 = r.read("w13");
  ASSERT_EQ(std::memcmp(raw_w13.view().data, file.w13.view().data, raw_w13.nbytes()), 0);

  const Weights w = file.weights();
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
