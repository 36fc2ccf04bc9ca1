// The Layer on the CPU backend against the f64 MoE of layer_util.h (the weights as given,
// dequantized; no activation quantization, no bf16 rounding). The error must stay within
// the scheme's quantization level, and a wrong weight (two experts swapped, a scale off
// by 2x) must push it past that level: the bound can fail.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "layer_util.h"

namespace moekit::test {
namespace {

// bf16 rounds the GEMM outputs and the activation (2^-8 relative each): measured 0.003-0.005.
// fp8 quantizes the hidden rows and the activation (2^-4 relative at worst, about 2.5% on
// average each): measured 0.03-0.056 at T = 13 over many seeds, so the cases use more tokens.
double bound_of(QuantScheme scheme) { return scheme == QuantScheme::bf16 ? 1e-2 : 8e-2; }

class CpuLayerIdeal : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuLayerIdeal, WithinQuantizationLevel) {
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  Layer layer(config_of(c), tl.weights(), options_of(c));
  const Tensor out = run_external(layer, in.hidden, in.routing);
  const std::vector<double> ref = f64_layer(config_of(c), tl.weights(), in.hidden, in.routing);
  const double err = relative_error(out, ref);
  EXPECT_LE(err, bound_of(c.scheme));
  // The bound is not so loose that anything passes: the error is a quantization error.
  EXPECT_GT(err, 1e-5);
  RecordProperty("relative_error", std::to_string(err));
}

std::vector<LayerCase> ideal_cases() {
  std::vector<LayerCase> cases;
  const QuantScheme schemes[] = {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                 QuantScheme::fp8_block};
  const Activation activations[] = {Activation::silu_and_mul, Activation::gelu_and_mul, Activation::swiglu_oai,
                                    Activation::relu2};
  for (QuantScheme s : schemes) {
    for (Activation a : activations) {
      LayerCase c;
      c.scheme = s;
      c.activation = a;
      c.tokens = 32;
      if (s == QuantScheme::fp8_block) c.hidden = 144, c.inter = 128;
      cases.push_back(c);
    }
  }
  LayerCase ue8m0;
  ue8m0.scheme = QuantScheme::fp8_block;
  ue8m0.hidden = 144, ue8m0.inter = 128;
  ue8m0.format = ScaleFormat::ue8m0;
  ue8m0.tokens = 32;
  cases.push_back(ue8m0);
  LayerCase grouped;
  grouped.scheme = QuantScheme::fp8_rowwise;
  grouped.method = RoutingMethod::sigmoid_bias_grouped;
  grouped.experts = 8, grouped.n_group = 4, grouped.topk_group = 2, grouped.top_k = 3;
  grouped.tokens = 32;
  cases.push_back(grouped);
  LayerCase ep = ue8m0;
  ep.format = ScaleFormat::f32, ep.ep_size = 2, ep.ep_rank = 1;
  ep.method = RoutingMethod::external, ep.ids = Ids::some_none;
  cases.push_back(ep);
  LayerCase odd;
  odd.hidden = 24, odd.inter = 40, odd.tokens = 32;
  cases.push_back(odd);
  odd.scheme = QuantScheme::fp8_rowwise;
  cases.push_back(odd);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerIdeal, ::testing::ValuesIn(ideal_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- Mutations: the layer gets subtly wrong weights, the reference the right ones. ----

enum class Mutation : std::uint8_t { swap_experts, scale_w2_of_one_expert, swap_gate_and_up };

struct MutationCase {
  QuantScheme scheme;
  Mutation mutation;
};
std::string mutation_name(const MutationCase& m) {
  const char* names[] = {"swap_experts", "scale_w2_of_one_expert", "swap_gate_and_up"};
  return underscored(to_string(m.scheme)) + "_" + names[int(m.mutation)];
}
void PrintTo(const MutationCase& m, std::ostream* os) { *os << mutation_name(m); }

// Swaps blocks [a, a + n) and [b, b + n) of elements of size `bytes` each.
void swap_ranges(const Tensor& t, std::int64_t a, std::int64_t b, std::int64_t n) {
  auto* p = static_cast<std::byte*>(t.view().data);
  const std::size_t bytes = dtype_size(t.dtype());
  std::swap_ranges(p + std::size_t(a) * bytes, p + std::size_t(a + n) * bytes, p + std::size_t(b) * bytes);
}

void mutate(core::SyntheticLayer& l, const MoEConfig& c, Mutation m) {
  switch (m) {
    case Mutation::swap_experts:
      for (const Tensor* t : {&l.w13, &l.w2, &l.w13_scale, &l.w2_scale}) {
        if (!t->defined()) continue;
        const std::int64_t per_expert = t->numel() / c.local_experts();
        swap_ranges(*t, 0, per_expert, per_expert);
      }
      return;
    case Mutation::scale_w2_of_one_expert: {
      // bf16 has no scales: scale the values themselves (exact, a power of two).
      const std::int64_t e = 1;
      if (c.quant.scheme == QuantScheme::bf16) {
        const std::int64_t per_expert = l.w2.numel() / c.local_experts();
        for (std::int64_t i = e * per_expert; i < (e + 1) * per_expert; ++i)
          l.w2.ptr<bf16>()[i] = float_to_bf16(2.0f * bf16_to_float(l.w2.ptr<bf16>()[i]));
        return;
      }
      const std::int64_t per_expert = l.w2_scale.numel() / c.local_experts();
      for (std::int64_t i = e * per_expert; i < (e + 1) * per_expert; ++i) l.w2_scale.ptr<float>()[i] *= 2.0f;
      return;
    }
    case Mutation::swap_gate_and_up: {
      // Rows [0, I) and [I, 2I) of every expert's w13 (the scales of fp8-rowwise/block too).
      const std::int64_t inter = c.intermediate_size, h = c.hidden_size;
      for (std::int64_t e = 0; e < c.local_experts(); ++e) {
        swap_ranges(l.w13, e * 2 * inter * h, e * 2 * inter * h + inter * h, inter * h);
        if (c.quant.scheme == QuantScheme::fp8_rowwise)
          swap_ranges(l.w13_scale, e * 2 * inter, e * 2 * inter + inter, inter);
        if (c.quant.scheme == QuantScheme::fp8_block) {
          const std::int64_t blocks = inter / kBlock * ceil_div(h, kBlock);
          swap_ranges(l.w13_scale, e * 2 * blocks, e * 2 * blocks + blocks, blocks);
        }
      }
      return;
    }
  }
}

class CpuLayerIdealMutation : public ::testing::TestWithParam<MutationCase> {};

TEST_P(CpuLayerIdealMutation, ExceedsTheBound) {
  const MutationCase m = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  LayerCase c;
  c.scheme = m.scheme;
  c.hidden = 144, c.inter = 128, c.tokens = 32;
  TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  const std::vector<double> ref = f64_layer(config_of(c), tl.weights(), in.hidden, in.routing);
  // The same check as above passes first, so that only the mutation makes the difference.
  {
    Layer layer(config_of(c), tl.weights(), options_of(c));
    ASSERT_LE(relative_error(run_external(layer, in.hidden, in.routing), ref), bound_of(c.scheme));
  }
  mutate(tl.synthetic, config_of(c), m.mutation);
  Layer layer(config_of(c), tl.weights(), options_of(c));
  const double err = relative_error(run_external(layer, in.hidden, in.routing), ref);
  EXPECT_GT(err, 1.5 * bound_of(c.scheme));
  RecordProperty("relative_error", std::to_string(err));
}

std::vector<MutationCase> mutation_cases() {
  std::vector<MutationCase> cases;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block})
    for (Mutation m : {Mutation::swap_experts, Mutation::scale_w2_of_one_expert, Mutation::swap_gate_and_up})
      cases.push_back({s, m});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerIdealMutation, ::testing::ValuesIn(mutation_cases()),
                         [](const auto& info) { return mutation_name(info.param); });

// ---- top1_sigmoid (Llama-4): the router weight multiplies the input row, not the output. ----

struct Top1Case {
  QuantScheme scheme;
  Activation activation;
};
std::string top1_name(const Top1Case& t) {
  return underscored(to_string(t.scheme)) + "_" + std::string(to_string(t.activation));
}
void PrintTo(const Top1Case& t, std::ostream* os) { *os << top1_name(t); }

class CpuLayerTop1Sigmoid : public ::testing::TestWithParam<Top1Case> {};

TEST_P(CpuLayerTop1Sigmoid, WeightOnInputDiffersFromOutput) {
  const Top1Case t = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  LayerCase c;
  c.scheme = t.scheme;
  c.activation = t.activation;
  c.method = RoutingMethod::top1_sigmoid;
  c.top_k = 1;
  c.tokens = 32;
  const TestLayer tl = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, tl, seed);
  const MoEConfig config = config_of(c);
  ASSERT_EQ(config.routing.effective_placement(), WeightPlacement::input);

  Layer layer(config, tl.weights(), options_of(c));
  Tensor out = poisoned_out(c.tokens, c.hidden);
  layer.forward(FusedArgs{in.hidden.view(), in.logits.view(), out.view(), {}, {}});
  const std::vector<double> on_input = f64_layer(config, tl.weights(), in.hidden, in.routing);
  EXPECT_LE(relative_error(out, on_input), bound_of(c.scheme));

  // sigmoid_topk with k = 1 routes identically but weights the output.
  MoEConfig output_config = config;
  output_config.routing.method = RoutingMethod::sigmoid_topk;
  const Routing same = route_with(output_config.routing, in.logits, Tensor());
  ASSERT_EQ(bit_differences(same.ids, in.routing.ids), 0);
  const std::vector<double> on_output = f64_layer(output_config, tl.weights(), in.hidden, same);
  const double differs = relative_error(out, on_output);
  EXPECT_GT(differs, 1.5 * bound_of(c.scheme));
  RecordProperty("relative_error", std::to_string(differs));
  Layer output_layer(output_config, tl.weights());
  const Tensor out2 = run_external(output_layer, in.hidden, same);
  EXPECT_LE(relative_error(out2, on_output), bound_of(c.scheme));

  // Any method with weight_placement = input behaves the same: external routing, k = 1.
  MoEConfig external = config;
  external.routing.method = RoutingMethod::external;
  external.routing.weight_placement = WeightPlacement::input;
  Layer external_layer(external, tl.weights());
  EXPECT_EQ(bit_differences(run_external(external_layer, in.hidden, in.routing), out), 0);
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerTop1Sigmoid,
                         ::testing::Values(Top1Case{QuantScheme::bf16, Activation::silu_and_mul},
                                           Top1Case{QuantScheme::bf16, Activation::relu2},
                                           Top1Case{QuantScheme::fp8_rowwise, Activation::silu_and_mul},
                                           Top1Case{QuantScheme::fp8_tensor, Activation::gelu_and_mul}),
                         [](const auto& info) { return top1_name(info.param); });

}  // namespace
}  // namespace moekit::test
