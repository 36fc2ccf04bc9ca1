// Shared experts (MoEConfig::shared_experts) on the CPU backend: the fused layer against the
// routed layer and the shared experts run alone, summed (cpu/shared_util.h), bit for bit, in the
// fused and external routing forms; dynamic fp8-tensor, whose activation scale is the amax of all
// rows, against the layer's own pipeline reference. Then the masked format over the shared
// blocks, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/shared.h"
#include "shared_util.h"

namespace moekit::test {
namespace {

LayerCase shared_case(QuantScheme scheme, std::int64_t shared, RoutingMethod method) {
  LayerCase c;
  c.scheme = scheme;
  c.method = method;
  c.experts = 8, c.hidden = 256, c.inter = 128, c.tokens = 19, c.top_k = 3;
  c.shared = shared;
  if (method == RoutingMethod::sigmoid_bias_grouped) c.n_group = 4, c.topk_group = 2;
  return c;
}

std::vector<LayerCase> cases() {
  std::vector<LayerCase> all;
  for (const QuantScheme scheme : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                   QuantScheme::fp8_block})
    for (const std::int64_t shared : {1, 2}) {
      LayerCase c = shared_case(scheme, shared, RoutingMethod::sigmoid_bias_grouped);  // DeepSeek-V3's routing
      c.static_scales = scheme == QuantScheme::fp8_tensor;  // the parts then quantize as the fused layer
      all.push_back(c);
      c.method = RoutingMethod::external;
      c.n_group = c.topk_group = 1;
      c.ids = Ids::some_none;
      c.shared_weight = 0.75f;  // a model's own scaling of the shared experts
      all.push_back(c);
    }
  LayerCase relu = shared_case(QuantScheme::fp8_block, 1, RoutingMethod::softmax_topk_renorm);
  relu.activation = Activation::relu2;
  relu.tokens = 1;
  all.push_back(relu);
  return all;
}

// The layer's output, fused routing (checking the routing it hands back: the routed slots alone)
// or external.
Tensor run_layer(Layer& layer, const LayerCase& c, const Inputs& in) {
  if (c.method == RoutingMethod::external) return run_external(layer, in.hidden, in.routing);
  Tensor out = poisoned_out(c.tokens, c.hidden);
  const Routing got{Tensor(DType::i32, {c.tokens, c.top_k}), Tensor(DType::f32, {c.tokens, c.top_k})};
  poison(got.ids.view());
  poison(got.weights.view());
  layer.forward(FusedArgs{in.hidden.view(), in.logits.view(), out.view(), got.ids.view(), got.weights.view()});
  EXPECT_EQ(bit_differences(got.ids, in.routing.ids), 0) << "the routing handed back is the routed experts'";
  EXPECT_EQ(bit_differences(got.weights, in.routing.weights), 0);
  return out;
}

class CpuLayerShared : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerShared, EqualsTheRoutedLayerPlusTheSharedExpertsRunAlone) {
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  const TestLayer tl = make_test_layer(c, seed);
  ASSERT_EQ(tl.synthetic.w13.size(0), c.experts + c.shared) << "the shared experts follow the routed ones";
  const Inputs in = make_inputs(c, tl, seed);
  Layer layer(config, tl.weights());
  const Tensor out = run_layer(layer, c, in);
  const Tensor want = apart_reference(config, tl.weights(), in.hidden, in.routing);
  std::int64_t first = -1;
  EXPECT_EQ(bit_differences(out, want, &first), 0)
      << "first at token " << first / c.hidden << " column " << first % c.hidden;
  EXPECT_EQ(bit_differences(out, run_pipeline_reference(config, tl.weights(), in.hidden, in.routing)), 0)
      << "the library's reference of the fused layer";
  // The shared experts count: without them nearly every element is another.
  const core::SharedParts parts = core::split_shared(config, tl.weights());
  Layer routed(parts.routed, parts.routed_weights);
  EXPECT_GT(bit_differences(run_layer(routed, c, in), out), out.numel() / 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuLayerShared, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return case_name(info.param); });

// fp8-tensor with dynamic scales quantizes the activations of every row, the shared experts'
// included, with one scale: the parts alone would each take their own.
TEST(CpuLayerSharedFp8Tensor, DynamicScalesCoverTheSharedRowsToo) {
  for (const bool external : {false, true}) {
    LayerCase c = shared_case(QuantScheme::fp8_tensor, 1, external ? RoutingMethod::external : RoutingMethod::topk_softmax);
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(case_name(c) + " seed " + std::to_string(seed));
    const MoEConfig config = config_of(c);
    const TestLayer tl = make_test_layer(c, seed);
    const Inputs in = make_inputs(c, tl, seed);
    Layer layer(config, tl.weights());
    EXPECT_EQ(bit_differences(run_layer(layer, c, in), run_pipeline_reference(config, tl.weights(), in.hidden, in.routing)), 0);
  }
}

// The workspace form, and T = 0.
TEST(CpuLayerSharedCalls, CallerWorkspaceAndNoTokens) {
  const LayerCase c = shared_case(QuantScheme::fp8_block, 2, RoutingMethod::external);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  const TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  Layer layer(config, tl.weights());
  std::vector<std::byte> ws(layer.workspace_size(c.tokens) + 256);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 255) / 256 * 256);
  Tensor out = poisoned_out(c.tokens, c.hidden);
  layer.forward(ExternalArgs{in.hidden.view(), in.routing.ids.view(), in.routing.weights.view(), out.view()},
                Workspace{aligned, ws.size() - 256}, nullptr);
  EXPECT_EQ(bit_differences(out, apart_reference(config, tl.weights(), in.hidden, in.routing)), 0);
  const Tensor none = poisoned_out(0, c.hidden);
  const Routing empty{Tensor(DType::i32, {0, c.top_k}), Tensor(DType::f32, {0, c.top_k})};
  EXPECT_NO_THROW(run_external(layer, none, empty));
}

// The masked format runs the layer's experts, the shared ones the last S blocks: each block as the
// routed layer's or the shared experts' own masked call gives it.
TEST(CpuLayerSharedMasked, TheLastBlocksAreTheSharedExperts) {
  const LayerCase c = shared_case(QuantScheme::fp8_block, 2, RoutingMethod::softmax_topk_renorm);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  const TestLayer tl = make_test_layer(c, seed);
  const core::SharedParts parts = core::split_shared(config, tl.weights());
  const std::int64_t blocks = c.experts + c.shared, cap = 4, h = c.hidden;
  const Tensor hidden = core::make_hidden(blocks * cap, h, seed);
  Tensor counts(DType::i32, {blocks});
  for (std::int64_t e = 0; e < blocks; ++e) counts.ptr<std::int32_t>()[e] = std::int32_t((e * 3 + 1) % (cap + 1));
  auto masked = [&](const MoEConfig& m, const Weights& w, std::int64_t first, std::int64_t count) {
    Layer layer(m, w);
    Tensor out(DType::bf16, {count, cap, h});
    poison(out.view());
    auto* in = static_cast<std::byte*>(hidden.view().data) + std::size_t(first * cap * h) * 2;
    layer.forward(MaskedArgs{TensorView::contiguous(in, DType::bf16, {count, cap, h}), {},
                             TensorView::contiguous(counts.ptr<std::int32_t>() + first, DType::i32, {count}), out.view(), 0});
    return out;
  };
  const Tensor all = masked(config, tl.weights(), 0, blocks);
  const Tensor routed = masked(parts.routed, parts.routed_weights, 0, c.experts);
  const Tensor shared = masked(parts.shared, parts.shared_weights, c.experts, c.shared);
  for (std::int64_t e = 0; e < blocks; ++e)
    for (std::int64_t j = 0; j < counts.ptr<std::int32_t>()[e]; ++j) {
      const Tensor& part = e < c.experts ? routed : shared;
      const std::int64_t row = (e < c.experts ? e : e - c.experts) * cap + j;
      EXPECT_EQ(std::memcmp(all.ptr<bf16>() + (e * cap + j) * h, part.ptr<bf16>() + row * h, std::size_t(h) * 2), 0)
          << "block " << e << " row " << j;
    }
}

void expect_error(const std::function<void()>& f, const std::string& start) {
  try {
    f();
    ADD_FAILURE() << "expected an Error beginning '" << start << "'";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(start, 0), 0u) << e.what();
  }
}

TEST(CpuLayerSharedErrors, BadConfigsWeightsAndCallsAreRefusedByName) {
  const LayerCase c = shared_case(QuantScheme::bf16, 1, RoutingMethod::external);
  const MoEConfig config = config_of(c);
  const TestLayer tl = make_test_layer(c, 7);
  MoEConfig bad = config;
  bad.shared_experts = -1;
  expect_error([&] { validate(bad); }, "shared_experts:");
  bad = config;
  bad.shared_expert_weight = NAN;
  expect_error([&] { validate(bad); }, "shared_expert_weight:");
  bad = config;
  bad.routing.method = RoutingMethod::top1_sigmoid;
  bad.routing.top_k = 1;
  expect_error([&] { validate(bad); }, "shared_experts:");  // Llama-4's weight on the input
  // The routed experts' weights alone: w13 must hold the shared ones too.
  const core::SharedParts parts = core::split_shared(config, tl.weights());
  expect_error([&] { Layer l(config, parts.routed_weights); }, "w13:");
  // Every rank would add them to a sum the caller makes.
  MoEConfig two = config;
  two.ep_size = 2;
  const core::SyntheticLayer half = core::make_synthetic_layer(two, 7);
  LayerOptions alone;
  alone.ep.scope = EpScope::this_rank;
  expect_error([&] { Layer l(two, half.weights(), alone); }, "ep.scope:");
  // Ids of the shared experts are the layer's business: the caller's stay in [-1, E).
  Layer layer(config, tl.weights());
  const Tensor hidden = core::make_hidden(2, c.hidden, 7);
  Routing r{Tensor(DType::i32, {2, c.top_k}), Tensor(DType::f32, {2, c.top_k})};
  for (std::int64_t i = 0; i < r.ids.numel(); ++i) r.ids.ptr<std::int32_t>()[i] = 0, r.weights.ptr<float>()[i] = 1.0f;
  r.ids.ptr<std::int32_t>()[3] = std::int32_t(c.experts);
  expect_error([&] { run_external(layer, hidden, r); }, "topk_ids:");
}

}  // namespace
}  // namespace moekit::test
