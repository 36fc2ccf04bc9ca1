// The masked format on the CPU backend (Layer::forward(MaskedArgs)): each row below its block's
// count gets, bit for bit, what the layer gives that row routed to the block's expert alone with
// weight 1; rows past the counts are not written; bad arguments are refused by name.
#include <gtest/gtest.h>

#include <string>

#include "masked_util.h"

namespace moekit::test {
namespace {

Tensor poisoned_masked(std::int64_t experts, std::int64_t capacity, std::int64_t hidden) {
  Tensor out(DType::bf16, {experts, capacity, hidden});
  poison(out.view());
  return out;
}

MaskedArgs masked_args(const MaskedCase& c, const MaskedInputs& in, const Tensor& out) {
  MaskedArgs a;
  a.hidden = c.fp8_input ? in.q.view() : in.hidden.view();
  if (c.fp8_input) a.hidden_scale = masked_scale_view(c, in.scales.view());
  a.counts = in.counts.view();
  a.out = out.view();
  a.expected_rows = c.expected_rows;
  return a;
}

class CpuLayerMasked : public ::testing::TestWithParam<MaskedCase> {};

TEST_P(CpuLayerMasked, EachRowGetsItsExpertsOutput) {
  const MaskedCase& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c.layer);
  const TestLayer tl = make_test_layer(c.layer, seed);
  const MaskedInputs in = make_masked_inputs(c, seed);
  Layer layer(config, tl.weights(), options_of(c.layer));
  const std::int64_t el = config.local_experts();
  Tensor out = poisoned_masked(el, c.capacity, config.hidden_size);
  layer.forward(masked_args(c, in, out));

  Tensor got;
  std::string why;
  ASSERT_TRUE(masked_rows(c, out, got, why)) << why;
  // The reference: the same rows through the token format, each to its expert with weight 1.
  const Tensor ref = run_external(layer, in.rows, in.routing);
  std::int64_t first = -1;
  EXPECT_EQ(bit_differences(got, ref, &first), 0)
      << "first at packed row " << first / config.hidden_size << " column " << first % config.hidden_size;

  // The caller's workspace gives the same bits.
  Tensor again = poisoned_masked(el, c.capacity, config.hidden_size);
  std::vector<std::byte> ws(layer.masked_workspace_size(c.capacity) + 256);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 255) / 256 * 256);
  layer.forward(masked_args(c, in, again), Workspace{aligned, ws.size() - 256}, nullptr);
  EXPECT_EQ(bit_differences(again, out), 0);
}

std::vector<MaskedCase> cases() {
  std::vector<MaskedCase> out;
  auto add = [&](std::string name, const LayerCase& l, std::int64_t cap, bool fp8_input, bool mn, std::uint64_t seed) {
    out.push_back(masked_case(std::move(name), l, cap, fp8_input, mn, 0, seed));
  };
  LayerCase bf16;
  bf16.experts = 12, bf16.hidden = 256, bf16.inter = 128, bf16.top_k = 4;
  LayerCase block = bf16;
  block.scheme = QuantScheme::fp8_block;
  add("bf16_C16", bf16, 16, false, false, 1);
  add("bf16_C1", bf16, 1, false, false, 2);
  add("fp8_block_bf16_input_C16", block, 16, false, false, 3);
  add("fp8_block_fp8_input_C16", block, 16, true, false, 4);
  add("fp8_block_fp8_input_mn_scales_C24", block, 24, true, true, 5);
  LayerCase ue8m0 = block;
  ue8m0.format = ScaleFormat::ue8m0, ue8m0.activation = Activation::swiglu_oai, ue8m0.hidden = 320;
  add("fp8_block_ue8m0_swiglu_oai_partial_k_block", ue8m0, 8, false, false, 6);
  LayerCase ep = block;
  ep.ep_size = 3, ep.ep_rank = 1;
  add("fp8_block_ep1of3", ep, 16, true, true, 7);
  return out;
}

INSTANTIATE_TEST_SUITE_P(, CpuLayerMasked, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<MaskedCase>& i) { return i.param.name; });

// Every argument is checked before anything is written, and named.
TEST(CpuLayerMaskedArgs, BadArgumentsAreRefusedByName) {
  LayerCase l;
  l.experts = 4, l.hidden = 256, l.inter = 128, l.top_k = 2, l.scheme = QuantScheme::fp8_block;
  MaskedCase c;
  c.layer = l;
  c.capacity = 8;
  c.counts = {1, 2, 3, 4};
  c.fp8_input = true;
  const MoEConfig config = config_of(l);
  const TestLayer tl = make_test_layer(l, 11);
  const MaskedInputs in = make_masked_inputs(c, 11);
  Layer layer(config, tl.weights(), options_of(l));
  Tensor out = poisoned_masked(4, 8, 256);
  auto refused = [&](MaskedArgs a, const std::string& name) {
    try {
      layer.forward(a);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(name + ":", 0), 0u) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a bad " << name;
  };
  const MaskedArgs good = masked_args(c, in, out);
  MaskedArgs a = good;
  a.hidden_scale = {};
  refused(a, "hidden_scale");
  a = good;
  a.hidden = in.hidden.view();  // bf16 rows with scales
  refused(a, "hidden_scale");
  a = good;
  Tensor wrong_out(DType::bf16, {4, 7, 256});
  a.out = wrong_out.view();
  refused(a, "out");
  a = good;
  Tensor counts(DType::i32, {3});
  a.counts = counts.view();
  refused(a, "counts");
  a = good;
  a.expected_rows = 9;
  refused(a, "expected_rows");
  a = good;
  Tensor two_d(DType::fp8_e4m3, {32, 256});
  a.hidden = two_d.view();
  refused(a, "hidden");
  a = good;
  TensorView strided = in.scales.view();
  strided.strides = {32, 2, 1};  // neither layout
  a.hidden_scale = strided;
  refused(a, "hidden_scale");
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.ptr<bf16>()[i].bits, 0xffff) << "written at " << i;
  EXPECT_THROW(layer.masked_workspace_size(0), Error);

  // Per-row and per-tensor FP8 layers do not take the masked format.
  LayerCase rowwise = l;
  rowwise.scheme = QuantScheme::fp8_rowwise;
  const TestLayer rl = make_test_layer(rowwise, 12);
  Layer rowwise_layer(config_of(rowwise), rl.weights(), options_of(rowwise));
  MaskedArgs b = good;
  b.hidden = in.hidden.view();
  b.hidden_scale = {};
  try {
    rowwise_layer.forward(b);
    ADD_FAILURE() << "fp8-rowwise accepted the masked format";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("quant:", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace moekit::test
