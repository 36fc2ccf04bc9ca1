// The library's references (src/cpu/reference.h) checked from outside: ideal_reference on
// the dequantized weights equals the f64 MoE of layer_util.h to f64 rounding, and on the
// master weights it differs by what weight quantization costs, no more.
#include "cpu/reference.h"

#include <gtest/gtest.h>

#include <string>

#include "core/master_weights.h"
#include "layer_util.h"

namespace moekit::test {
namespace {

// A case's layer and inputs from one fresh seed, and the references' view of them.
struct ReferenceCase {
  explicit ReferenceCase(const LayerCase& c)
      : seed(fresh_seed()), config(config_of(c)), tl(make_test_layer(c, seed)), in(make_inputs(c, tl, seed)) {}
  cpu::ReferenceInputs inputs() const {
    return {config, tl.weights(), in.hidden.view(), in.routing.ids.view(), in.routing.weights.view()};
  }
  std::uint64_t seed;
  MoEConfig config;
  TestLayer tl;
  Inputs in;
};

class CpuReferenceIdeal : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuReferenceIdeal, MatchesTheF64Layer) {
  const LayerCase c = GetParam();
  const ReferenceCase setup(c);
  SCOPED_TRACE("seed " + std::to_string(setup.seed));
  const std::uint64_t seed = setup.seed;
  const MoEConfig& config = setup.config;
  const TestLayer& tl = setup.tl;
  const Inputs& in = setup.in;
  const cpu::ReferenceInputs ri = setup.inputs();
  const std::vector<double> mine = f64_layer(config, tl.weights(), in.hidden, in.routing);

  const std::vector<double> deq = cpu::ideal_reference(ri, core::DequantizedWeights(config, tl.weights()));
  ASSERT_EQ(deq.size(), mine.size());
  double err2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    err2 += (deq[i] - mine[i]) * (deq[i] - mine[i]);
    ref2 += mine[i] * mine[i];
  }
  EXPECT_LE(std::sqrt(err2), 1e-12 * std::sqrt(ref2));

  // Against the weights before quantization: the cost of quantizing the weights.
  const std::vector<double> master = cpu::ideal_reference(ri, core::SyntheticMaster(config, seed));
  err2 = 0.0;
  for (std::size_t i = 0; i < mine.size(); ++i) err2 += (master[i] - mine[i]) * (master[i] - mine[i]);
  const double cost = std::sqrt(err2 / ref2);
  EXPECT_LE(cost, c.scheme == QuantScheme::bf16 ? 1e-2 : 8e-2);
  EXPECT_GT(cost, 1e-5);
}

std::vector<LayerCase> reference_cases() {
  std::vector<LayerCase> cases;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block}) {
    LayerCase c{s, Activation::swiglu_oai};
    if (s == QuantScheme::fp8_block) c.hidden = 144, c.inter = 128;
    cases.push_back(c);
  }
  LayerCase top1{QuantScheme::fp8_rowwise, Activation::silu_and_mul, RoutingMethod::top1_sigmoid};
  top1.top_k = 1;
  cases.push_back(top1);
  LayerCase ep{QuantScheme::bf16, Activation::relu2, RoutingMethod::external};
  ep.ep_size = 3, ep.ep_rank = 1, ep.ids = Ids::some_none;
  cases.push_back(ep);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuReferenceIdeal, ::testing::ValuesIn(reference_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The sensitivity references of the check (core::kGemm1Flips): no flips, the reference's bits;
// flips, another output a little away from it, the same bits again for the same seed; the
// steps of each scale's largest value move FP8 references alone.
class CpuReferenceFlips : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CpuReferenceFlips, MoveTheOutputALittleAndRepeat) {
  const LayerCase c = GetParam();
  const ReferenceCase setup(c);
  SCOPED_TRACE("seed " + std::to_string(setup.seed));
  cpu::ReferenceInputs ri = setup.inputs();
  auto run = [&](double flips, std::uint64_t flip_seed) {
    ri.gemm1_flips = flips;
    ri.flip_seed = flip_seed;
    Tensor out(DType::bf16, {setup.in.hidden.size(0), setup.config.hidden_size});
    cpu::pipeline_reference(ri, out.view());
    return out;
  };
  const Tensor plain = run(0.0, 0), none = run(0.0, 5), moved = run(1.0 / 32, 5), again = run(1.0 / 32, 5);
  const Tensor other = run(1.0 / 32, 6);
  auto differing = [&](const Tensor& a, const Tensor& b) {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) n += a.ptr<std::uint16_t>()[i] != b.ptr<std::uint16_t>()[i];
    return n;
  };
  EXPECT_EQ(differing(plain, none), 0);
  EXPECT_EQ(differing(moved, again), 0);
  EXPECT_GT(differing(plain, moved), 0);
  EXPECT_GT(differing(moved, other), 0);
  double err2 = 0.0, ref2 = 0.0;
  for (std::int64_t i = 0; i < plain.numel(); ++i) {
    const double p = bf16_to_float(plain.ptr<bf16>()[i]), m = bf16_to_float(moved.ptr<bf16>()[i]);
    err2 += (m - p) * (m - p);
    ref2 += p * p;
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 5e-2);  // a device's worth of flips, not another layer
  // The largest value under each scale a step away too: FP8 references move, bf16 has no scales.
  ri.gemm1_scale_steps = true;
  const Tensor stepped = run(0.0, 5), stepped_again = run(0.0, 5);
  EXPECT_EQ(differing(stepped, stepped_again), 0);
  if (c.scheme == QuantScheme::bf16) EXPECT_EQ(differing(plain, stepped), 0);
  else EXPECT_GT(differing(plain, stepped), 0);
}

INSTANTIATE_TEST_SUITE_P(, CpuReferenceFlips, ::testing::ValuesIn(reference_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace moekit::test
