// The Layer on the CPU backend against cpu::pipeline_reference: the same quantization points
// and arithmetic order, token by token instead of permuted, so the bits must agree. Then
// expert parallelism: each rank computes only its experts, and the ranks' outputs add up
// to the ep = 1 output within the rounding of the partial sums.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "layer_util.h"

namespace moekit::test {
namespace {

bool has_nan(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(bf16_to_float(t.ptr<bf16>()[i]))) return true;
  return false;
}

class CpuLayerPipeline : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerPipeline, BitIdenticalToPipelineReference) {
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  const TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  Layer layer(config, tl.weights(), options_of(c));
  EXPECT_EQ(layer.backend_name(), "cpu");

  Tensor out = poisoned_out(c.tokens, c.hidden);
  if (c.method == RoutingMethod::external) {
    out = run_external(layer, in.hidden, in.routing);
  } else {
    // Fused routing, with the routing it computed handed back.
    const Routing got{Tensor(DType::i32, {c.tokens, c.top_k}), Tensor(DType::f32, {c.tokens, c.top_k})};
    poison(got.ids.view());
    poison(got.weights.view());
    layer.forward(FusedArgs{in.hidden.view(), in.logits.view(), out.view(), got.ids.view(), got.weights.view()});
    EXPECT_EQ(bit_differences(got.ids, in.routing.ids), 0);
    EXPECT_EQ(std::memcmp(got.weights.view().data, in.routing.weights.view().data, got.weights.nbytes()), 0);
  }
  const Tensor ref = run_pipeline_reference(config, tl.weights(), in.hidden, in.routing);
  ASSERT_FALSE(has_nan(out)) << "an output element was not written (or is NaN)";
  ASSERT_FALSE(has_nan(ref));
  std::int64_t first = -1;
  EXPECT_EQ(bit_differences(out, ref, &first), 0)
      << "first at token " << first / c.hidden << " column " << first % c.hidden;
}

// DESIGN §8's batch invariance: a token's output has the same bits in every batch it comes in
// (alone, among a few, among all), for each scheme the mode takes.
TEST(CpuLayerBatchInvariance, ATokenHasTheSameOutputInEveryBatch) {
  for (const QuantScheme scheme : {QuantScheme::bf16, QuantScheme::fp8_block, QuantScheme::fp8_rowwise}) {
    LayerCase c;
    c.scheme = scheme;
    c.experts = 16, c.hidden = 256, c.inter = 128, c.tokens = 40, c.top_k = 4;
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(case_name(c) + " seed " + std::to_string(seed));
    MoEConfig config = config_of(c);
    config.batch_invariant = true;
    const TestLayer tl = make_test_layer(c, seed);
    const Inputs in = make_inputs(c, tl, seed);
    Layer layer(config, tl.weights());
    const Tensor all = run_external(layer, in.hidden, in.routing);
    for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {17, 1}, {3, 9}, {20, 20}}) {
      const Tensor part = run_external(layer, row_slice(in.hidden, first, count), row_slice(in.routing, first, count));
      EXPECT_EQ(bit_differences(part, row_slice(all, first, count)), 0) << "tokens " << first << " .. " << first + count - 1;
    }
  }
}

constexpr RoutingMethod kComputedMethods[] = {
    RoutingMethod::softmax_topk,         RoutingMethod::topk_softmax,        RoutingMethod::softmax_topk_renorm,
    RoutingMethod::sigmoid_topk,         RoutingMethod::sigmoid_topk_renorm, RoutingMethod::sigmoid_bias_grouped,
    RoutingMethod::sigmoid_bias_renorm,  RoutingMethod::top1_sigmoid};

LayerCase with_method(LayerCase c, RoutingMethod m) {
  c.method = m;
  if (m == RoutingMethod::top1_sigmoid) c.top_k = 1;
  if (m == RoutingMethod::sigmoid_bias_grouped) c.n_group = 3, c.topk_group = 2;  // E = 6
  return c;
}

LayerCase block_shapes(LayerCase c) {
  if (c.scheme == QuantScheme::fp8_block) c.hidden = 144, c.inter = 128;
  return c;
}

std::vector<LayerCase> pipeline_cases() {
  std::vector<LayerCase> cases;
  // Every scheme x activation, the routing methods taking turns (each appears twice).
  std::size_t turn = 0;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block}) {
    for (Activation a : {Activation::silu_and_mul, Activation::gelu_and_mul, Activation::swiglu_oai, Activation::relu2}) {
      LayerCase c;
      c.scheme = s;
      c.activation = a;
      cases.push_back(block_shapes(with_method(c, kComputedMethods[turn++ % 8])));
    }
  }
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block}) {
    LayerCase c;
    c.scheme = s;
    c = block_shapes(c);
    LayerCase none = c, one = c, empty = c, single = c, ep0 = c, ep1 = c;
    none.method = RoutingMethod::external, none.ids = Ids::some_none;
    one.method = RoutingMethod::external, one.ids = Ids::one_expert;
    empty.tokens = 0;
    single.tokens = 1;
    ep0.ep_size = 2, ep0.ep_rank = 0;
    ep1.ep_size = 2, ep1.ep_rank = 1;
    ep1.method = RoutingMethod::external, ep1.ids = Ids::some_none;
    for (const LayerCase& x : {none, one, empty, single, ep0, ep1}) cases.push_back(x);
  }
  LayerCase x;
  x.scheme = QuantScheme::fp8_tensor, x.static_scales = true;
  cases.push_back(x);
  x.ep_size = 2, x.ep_rank = 1;
  cases.push_back(x);
  x = {};
  x.scheme = QuantScheme::fp8_rowwise, x.format = ScaleFormat::ue8m0;
  cases.push_back(x);
  x.scheme = QuantScheme::fp8_tensor;
  cases.push_back(x);
  x = block_shapes(LayerCase{QuantScheme::fp8_block});
  x.format = ScaleFormat::ue8m0, x.activation = Activation::swiglu_oai;
  cases.push_back(x);
  x = with_method(LayerCase{}, RoutingMethod::sigmoid_bias_renorm);
  x.logits_dtype = DType::bf16, x.scheme = QuantScheme::fp8_rowwise;
  cases.push_back(x);
  x = LayerCase{QuantScheme::fp8_tensor, Activation::gelu_and_mul, RoutingMethod::topk_softmax};
  x.experts = 5, x.top_k = 3;
  cases.push_back(x);
  // DeepSeek-like grouping: 8 experts in 4 groups, 2 groups kept, 3 experts per token.
  x = block_shapes(LayerCase{QuantScheme::fp8_block, Activation::silu_and_mul, RoutingMethod::sigmoid_bias_grouped});
  x.experts = 8, x.n_group = 4, x.topk_group = 2, x.top_k = 3, x.tokens = 20;
  cases.push_back(x);
  x.ep_size = 4, x.ep_rank = 3;
  cases.push_back(x);
  // One local expert per rank; every expert in every token's top k; minimal and odd sizes.
  x = LayerCase{QuantScheme::fp8_rowwise, Activation::swiglu_oai};
  x.ep_size = 6, x.ep_rank = 5;
  cases.push_back(x);
  x = LayerCase{QuantScheme::bf16, Activation::gelu_and_mul, RoutingMethod::softmax_topk};
  x.top_k = 6;
  cases.push_back(x);
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_rowwise, QuantScheme::fp8_tensor}) {
    x = LayerCase{s};
    x.hidden = 16, x.inter = 16;
    cases.push_back(x);
    x.hidden = 24, x.inter = 40, x.activation = Activation::relu2;
    cases.push_back(x);
  }
  // One expert owns every slot (k = 1) on a rank of its own.
  x = LayerCase{QuantScheme::fp8_rowwise, Activation::relu2, RoutingMethod::external};
  x.top_k = 1, x.ids = Ids::one_expert, x.ep_size = 3, x.ep_rank = 2;
  cases.push_back(x);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerPipeline, ::testing::ValuesIn(pipeline_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- Expert parallelism: ranks 0 and 1 of ep = 2 against ep = 1. ----

class CpuLayerEp : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerEp, RanksAddUpToEp1) {
  const LayerCase base = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Every rank generates the same global weights for the experts it owns (same seed).
  const TestLayer full_layer = make_test_layer(base, seed);
  const Inputs in = make_inputs(base, full_layer, seed);
  Layer full(config_of(base), full_layer.weights());
  const Tensor full_out = run_external(full, in.hidden, in.routing);

  std::vector<Tensor> parts;
  for (int rank = 0; rank < 2; ++rank) {
    LayerCase c = base;
    c.ep_size = 2, c.ep_rank = rank;
    const MoEConfig config = config_of(c);
    const TestLayer tl = make_test_layer(c, seed);
    Layer layer(config, tl.weights(), options_of(c));
    parts.push_back(run_external(layer, in.hidden, in.routing));
    EXPECT_EQ(bit_differences(parts.back(), run_pipeline_reference(config, tl.weights(), in.hidden, in.routing)), 0);
    // Only local experts contribute: a token with none of its experts here gets exact zeros.
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      bool local = false;
      for (int j = 0; j < c.top_k; ++j) {
        const std::int32_t id = in.routing.ids.ptr<std::int32_t>()[t * c.top_k + j];
        local = local || (id >= config.first_local_expert() && id < config.first_local_expert() + config.local_experts());
      }
      double norm = 0.0;
      for (std::int64_t h = 0; h < c.hidden; ++h) norm += std::abs(bf16_to_float(parts.back().ptr<bf16>()[t * c.hidden + h]));
      if (local) EXPECT_GT(norm, 0.0) << "rank " << rank << " token " << t;
      else EXPECT_EQ(norm, 0.0) << "rank " << rank << " token " << t;
    }
  }
  // Each partial and the full sum are rounded to bf16 once: half a step, 2^-8 relative.
  for (std::int64_t i = 0; i < full_out.numel(); ++i) {
    const double p0 = bf16_to_float(parts[0].ptr<bf16>()[i]), p1 = bf16_to_float(parts[1].ptr<bf16>()[i]);
    const double f = bf16_to_float(full_out.ptr<bf16>()[i]);
    const double sum = double(float(p0) + float(p1));
    ASSERT_LE(std::abs(sum - f), std::ldexp(std::abs(p0) + std::abs(p1) + std::abs(f), -8) * 1.001 + 1e-30)
        << "element " << i << ": " << p0 << " + " << p1 << " vs " << f;
  }
}

std::vector<LayerCase> ep_cases() {
  std::vector<LayerCase> cases;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block}) {
    LayerCase c = block_shapes(LayerCase{s});
    c.tokens = 17;
    // A dynamic per-tensor scale of the activations depends on which rows a rank holds;
    // static scales make every rank quantize alike.
    c.static_scales = s == QuantScheme::fp8_tensor;
    cases.push_back(c);
    c.ids = Ids::some_none, c.method = RoutingMethod::external, c.activation = Activation::gelu_and_mul;
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerEp, ::testing::ValuesIn(ep_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace moekit::test
