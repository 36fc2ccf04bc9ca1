// Fused and external routing give the same layer (DESIGN §1: two entry points, same result),
// the fused path's optional routing outputs equal moekit::route's, and the layer is
// deterministic: the same bits run after run and whatever the thread count.
#include <gtest/gtest.h>

#include <string>

#include "layer_util.h"
#include "scoped_env.h"

namespace moekit::test {
namespace {

LayerCase routing_case(RoutingMethod m, DType logits, QuantScheme scheme) {
  LayerCase c;
  c.method = m;
  c.logits_dtype = logits;
  c.scheme = scheme;
  c.experts = 8;
  c.tokens = 11;
  if (scheme == QuantScheme::fp8_block) c.hidden = 144, c.inter = 128;
  if (m == RoutingMethod::top1_sigmoid) c.top_k = 1;
  if (m == RoutingMethod::sigmoid_bias_grouped) c.n_group = 4, c.topk_group = 2, c.top_k = 3;
  return c;
}

class CpuLayerRouting : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerRouting, FusedEqualsExternal) {
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  TestLayer tl = make_test_layer(c, seed);
  if (tl.synthetic.e_score_correction_bias.defined() && c.logits_dtype == DType::bf16) {
    // The bias may be bf16 too (DESIGN §2).
    Tensor b(DType::bf16, {c.experts});
    for (std::int64_t e = 0; e < c.experts; ++e) b.ptr<bf16>()[e] = float_to_bf16(tl.synthetic.e_score_correction_bias.ptr<float>()[e]);
    tl.synthetic.e_score_correction_bias = std::move(b);
  }
  const Tensor hidden = core::make_hidden(c.tokens, c.hidden, seed + 1);
  const Tensor logits = core::make_router_logits(c.tokens, c.experts, c.logits_dtype, seed + 2);
  Layer layer(config, tl.weights());

  // Fused, handing back its routing.
  const Routing fused{Tensor(DType::i32, {c.tokens, c.top_k}), Tensor(DType::f32, {c.tokens, c.top_k})};
  poison(fused.ids.view());
  poison(fused.weights.view());
  Tensor fused_out = poisoned_out(c.tokens, c.hidden);
  layer.forward(FusedArgs{hidden.view(), logits.view(), fused_out.view(), fused.ids.view(), fused.weights.view()});

  // moekit::route on its own, then the external entry point of the same layer.
  const Routing routed = route_with(config.routing, logits, tl.synthetic.e_score_correction_bias);
  EXPECT_EQ(bit_differences(fused.ids, routed.ids), 0);
  EXPECT_EQ(std::memcmp(fused.weights.view().data, routed.weights.view().data, routed.weights.nbytes()), 0);
  const Tensor external_out = run_external(layer, hidden, routed);
  EXPECT_EQ(bit_differences(fused_out, external_out), 0);

  // Fused without routing outputs: the layer's own buffers, the same answer.
  Tensor plain_out = poisoned_out(c.tokens, c.hidden);
  layer.forward(FusedArgs{hidden.view(), logits.view(), plain_out.view(), {}, {}});
  EXPECT_EQ(bit_differences(plain_out, fused_out), 0);

  // An `external` layer given the same routing agrees too.
  MoEConfig ext = config;
  ext.routing.method = RoutingMethod::external;
  ext.routing.weight_placement = config.routing.effective_placement();
  Weights w = tl.weights();
  w.e_score_correction_bias = {};
  Layer external_layer(ext, w);
  EXPECT_EQ(bit_differences(run_external(external_layer, hidden, routed), fused_out), 0);

  // And the output is not trivially equal: it is finite and not all zero.
  double norm = 0.0;
  for (std::int64_t i = 0; i < fused_out.numel(); ++i) norm += std::abs(bf16_to_float(fused_out.ptr<bf16>()[i]));
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 0.0);
}

std::vector<LayerCase> routing_cases() {
  std::vector<LayerCase> cases;
  const RoutingMethod methods[] = {RoutingMethod::softmax_topk,        RoutingMethod::topk_softmax,
                                   RoutingMethod::softmax_topk_renorm, RoutingMethod::sigmoid_topk,
                                   RoutingMethod::sigmoid_topk_renorm, RoutingMethod::sigmoid_bias_grouped,
                                   RoutingMethod::sigmoid_bias_renorm, RoutingMethod::top1_sigmoid};
  std::size_t turn = 0;
  const QuantScheme schemes[] = {QuantScheme::bf16, QuantScheme::fp8_block, QuantScheme::fp8_rowwise,
                                 QuantScheme::fp8_tensor};
  for (RoutingMethod m : methods)
    for (DType d : {DType::f32, DType::bf16}) cases.push_back(routing_case(m, d, schemes[turn++ % 4]));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerRouting, ::testing::ValuesIn(routing_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- Determinism ----


class CpuLayerDeterminism : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerDeterminism, SameBitsEveryRunAndThreadCount) {
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  Layer layer(config_of(c), tl.weights());
  auto run = [&] {
    Tensor out = poisoned_out(c.tokens, c.hidden);
    layer.forward(FusedArgs{in.hidden.view(), in.logits.view(), out.view(), {}, {}});
    return out;
  };
  const Tensor first = run();
  EXPECT_EQ(bit_differences(run(), first), 0) << "second run";
  // The thread count changes how work is split into chunks; the bits must not move.
  for (const char* threads : {"1", "3", "7"}) {
    ScopedEnv env("MOEKIT_NUM_THREADS", threads);
    EXPECT_EQ(bit_differences(run(), first), 0) << "MOEKIT_NUM_THREADS=" << threads;
  }
  // A call with fewer tokens in between (buffers reused) does not disturb the next one.
  Tensor small = poisoned_out(1, c.hidden);
  const Tensor one_hidden = core::make_hidden(1, c.hidden, seed + 9);
  const Tensor one_logits = core::make_router_logits(1, c.experts, c.logits_dtype, seed + 10);
  layer.forward(FusedArgs{one_hidden.view(), one_logits.view(), small.view(), {}, {}});
  EXPECT_EQ(bit_differences(run(), first), 0) << "after a smaller call";
  // A new layer whose buffers first fit one token grows them for the full call.
  Layer fresh(config_of(c), tl.weights());
  Tensor small2 = poisoned_out(1, c.hidden);
  fresh.forward(FusedArgs{one_hidden.view(), one_logits.view(), small2.view(), {}, {}});
  EXPECT_EQ(bit_differences(small2, small), 0) << "one token";
  Tensor grown = poisoned_out(c.tokens, c.hidden);
  fresh.forward(FusedArgs{in.hidden.view(), in.logits.view(), grown.view(), {}, {}});
  EXPECT_EQ(bit_differences(grown, first), 0) << "after the buffers grew";
}

std::vector<LayerCase> determinism_cases() {
  std::vector<LayerCase> cases;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block}) {
    LayerCase c;
    c.scheme = s;
    c.tokens = 40;  // enough rows for several chunks
    if (s == QuantScheme::fp8_block) c.hidden = 144, c.inter = 128;
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerDeterminism, ::testing::ValuesIn(determinism_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace moekit::test
