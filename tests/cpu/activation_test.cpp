// Activations of DESIGN §5: the scalar functions against hand values and f64 formulas, and
// activate_row's layout (gate is the first I values, up the next I; relu2 reads I values).
#include "cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace moekit::cpu {
namespace {

// The f64 formulas use the f32 constants the functions receive.
const double kAlpha = double(1.702f), kLimit = 7.0;

double silu64(double x) { return x / (1.0 + std::exp(-x)); }
double gelu64(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double swiglu_oai64(double gate, double up) {
  gate = std::min(gate, kLimit);
  up = std::max(std::min(up, kLimit), -kLimit);
  return gate / (1.0 + std::exp(-kAlpha * gate)) * (up + 1.0);
}
double relu2_64(double x) { return x > 0 ? x * x : 0.0; }

// |got - want| within a few f32 rounding steps of the value, or of `scale` where an f32
// step of an intermediate (1 + erf(x) for gelu) is what limits the accuracy.
void expect_close(double got, double want, double scale, const std::string& what) {
  EXPECT_NEAR(got, want, 8e-7 * (std::abs(want) + scale)) << what;
}

struct HandCase {
  std::string name;
  Activation activation;
  float gate, up;
  double want;
};
void PrintTo(const HandCase& c, std::ostream* os) { *os << c.name; }

class CpuActivationHand : public ::testing::TestWithParam<HandCase> {};

float apply(Activation a, float gate, float up) {
  switch (a) {
    case Activation::silu_and_mul: return silu(gate) * up;
    case Activation::gelu_and_mul: return gelu(gate) * up;
    case Activation::swiglu_oai: return swiglu_oai(gate, up, float(kAlpha), float(kLimit));
    case Activation::relu2: return relu2(gate);
  }
  return NAN;
}

TEST_P(CpuActivationHand, Value) {
  const HandCase& c = GetParam();
  expect_close(apply(c.activation, c.gate, c.up), c.want, 1e-30, c.name);
}

const double kSig1 = 0.7310585786300049;  // sigma(1)

INSTANTIATE_TEST_SUITE_P(
    , CpuActivationHand,
    ::testing::Values(
        HandCase{"silu_0", Activation::silu_and_mul, 0.0f, 1.0f, 0.0},
        HandCase{"silu_1_times_2", Activation::silu_and_mul, 1.0f, 2.0f, 2 * kSig1},
        HandCase{"silu_minus1", Activation::silu_and_mul, -1.0f, 1.0f, -(1 - kSig1)},
        HandCase{"silu_minus20", Activation::silu_and_mul, -20.0f, 1.0f, -20.0 / (1 + std::exp(20.0))},
        HandCase{"gelu_1", Activation::gelu_and_mul, 1.0f, 1.0f, 0.8413447460685429},
        HandCase{"gelu_minus1", Activation::gelu_and_mul, -1.0f, 1.0f, -0.15865525393145707},
        HandCase{"gelu_2_times_3", Activation::gelu_and_mul, 2.0f, 3.0f, 3 * 1.9544997361036416},
        HandCase{"swiglu_oai_1_0", Activation::swiglu_oai, 1.0f, 0.0f, 1.0 / (1 + std::exp(-1.702))},
        // gate clamped above only, up on both sides
        HandCase{"swiglu_oai_gate_10_clamped_to_7", Activation::swiglu_oai, 10.0f, 1.0f,
                 7.0 / (1 + std::exp(-1.702 * 7)) * 2.0},
        HandCase{"swiglu_oai_gate_minus10_not_clamped", Activation::swiglu_oai, -10.0f, 1.0f,
                 -10.0 / (1 + std::exp(1.702 * 10)) * 2.0},
        HandCase{"swiglu_oai_up_10_clamped_to_7", Activation::swiglu_oai, 1.0f, 10.0f,
                 1.0 / (1 + std::exp(-1.702)) * 8.0},
        HandCase{"swiglu_oai_up_minus10_clamped_to_minus7", Activation::swiglu_oai, 1.0f, -10.0f,
                 1.0 / (1 + std::exp(-1.702)) * -6.0},
        HandCase{"relu2_3", Activation::relu2, 3.0f, 0.0f, 9.0},
        HandCase{"relu2_minus3", Activation::relu2, -3.0f, 0.0f, 0.0},
        HandCase{"relu2_half", Activation::relu2, 0.5f, 0.0f, 0.25}),
    [](const auto& info) { return info.param.name; });

TEST(CpuActivationFormula, ScalarsMatchF64OnRandomInputs) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  for (int i = 0; i < 5000; ++i) {
    const float g = dist(rng), u = dist(rng);
    const std::string what = "gate " + std::to_string(g) + " up " + std::to_string(u);
    expect_close(silu(g), silu64(g), 1e-20, "silu " + what);
    expect_close(gelu(g), gelu64(g), std::abs(g), "gelu " + what);
    // alpha * gate is rounded to f32 before exp: its error grows with |alpha * gate|.
    const double alpha_gate = kAlpha * std::min(double(g), kLimit);
    const double want = swiglu_oai64(g, u);
    EXPECT_NEAR(swiglu_oai(g, u, float(kAlpha), float(kLimit)), want,
                (8e-7 + 1.2e-7 * std::abs(alpha_gate)) * std::abs(want))
        << "swiglu_oai " << what;
    expect_close(relu2(g), relu2_64(g), 0.0, "relu2 " + what);
  }
}

struct RowCase {
  Activation activation;
  std::int64_t intermediate;
};
std::string row_name(const RowCase& c) {
  return std::string(to_string(c.activation)) + "_I" + std::to_string(c.intermediate);
}
void PrintTo(const RowCase& c, std::ostream* os) { *os << row_name(c); }

class CpuActivateRow : public ::testing::TestWithParam<RowCase> {};

// Gate and up drawn from different ranges, so swapping them or reading the wrong half shows.
TEST_P(CpuActivateRow, LayoutGateThenUp) {
  const RowCase c = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> gate_dist(-9.0f, 9.0f), up_dist(10.0f, 20.0f);
  const std::int64_t n = c.intermediate;
  const bool gated = c.activation != Activation::relu2;
  // relu2 reads only I values: the next I are NaN, and no output may be NaN.
  std::vector<bf16> row(std::size_t(2 * n));
  for (std::int64_t i = 0; i < n; ++i) {
    row[std::size_t(i)] = float_to_bf16(gate_dist(rng));
    row[std::size_t(n + i)] = gated ? float_to_bf16(up_dist(rng) * (i % 2 ? -1.0f : 1.0f)) : bf16{0x7fc0};
  }
  std::vector<float> out(std::size_t(n + 3));
  test::poison(TensorView::contiguous(out.data(), DType::f32, {n + 3}));
  ActivationParams params;
  params.activation = c.activation;
  params.intermediate_size = n;
  activate_row(params, row.data(), out.data());
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = bf16_to_float(row[std::size_t(i)]);
    const float u = gated ? bf16_to_float(row[std::size_t(n + i)]) : 0.0f;
    const float want = apply(c.activation, g, u);
    ASSERT_FALSE(std::isnan(out[std::size_t(i)])) << "element " << i;
    ASSERT_EQ(out[std::size_t(i)], want) << "element " << i << " gate " << g << " up " << u;
  }
  for (std::int64_t i = n; i < n + 3; ++i) EXPECT_TRUE(std::isnan(out[std::size_t(i)])) << "wrote past I at " << i;
}

INSTANTIATE_TEST_SUITE_P(, CpuActivateRow,
                         ::testing::Values(RowCase{Activation::silu_and_mul, 16},
                                           RowCase{Activation::gelu_and_mul, 37},
                                           RowCase{Activation::swiglu_oai, 64},
                                           RowCase{Activation::relu2, 24}),
                         [](const auto& info) { return row_name(info.param); });

TEST(CpuActivationParams, OfConfig) {
  MoEConfig c;
  c.activation = Activation::swiglu_oai;
  c.intermediate_size = 96;
  c.swiglu_alpha = 1.5f;
  c.swiglu_limit = 3.0f;
  const ActivationParams p = ActivationParams::of(c);
  EXPECT_EQ(p.activation, Activation::swiglu_oai);
  EXPECT_EQ(p.intermediate_size, 96);
  EXPECT_EQ(p.swiglu_alpha, 1.5f);
  EXPECT_EQ(p.swiglu_limit, 3.0f);
  // activate_row uses the given constants, not the defaults.
  const bf16 row[2] = {float_to_bf16(5.0f), float_to_bf16(5.0f)};
  float out = 0.0f;
  ActivationParams small = p;
  small.intermediate_size = 1;
  activate_row(small, row, &out);
  EXPECT_EQ(out, swiglu_oai(5.0f, 5.0f, 1.5f, 3.0f));
  EXPECT_NEAR(out, 3.0 / (1 + std::exp(-4.5)) * 4.0, 1e-5);
}

}  // namespace
}  // namespace moekit::cpu
