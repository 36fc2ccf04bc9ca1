// quantize_weights: each scheme's groups (per expert, per row, per 128x128 block, a partial last
// block included) get fp8_scale(amax) and the codes fp8(x / scale); bad arguments are Errors.
#include <gtest/gtest.h>

#include <random>

#include "moekit/error.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::test {
namespace {

struct QuantizeCase {
  QuantScheme scheme;
  std::int64_t experts, n, k;
};

class CoreQuantizeWeights : public ::testing::TestWithParam<QuantizeCase> {};

TEST_P(CoreQuantizeWeights, EveryGroupHasTheScaleOfItsAmax) {
  const auto [scheme, experts, n, k] = GetParam();
  std::mt19937_64 rng(fresh_seed());
  Tensor w(DType::f32, {experts, n, k});
  fill_uniform(w, -3.0f, 3.0f, rng);
  Tensor q(DType::fp8_e4m3, {experts, n, k});
  const std::int64_t nb = ceil_div(n, kBlock), kb = ceil_div(k, kBlock);
  Tensor s = scheme == QuantScheme::fp8_tensor    ? Tensor(DType::f32, {experts})
             : scheme == QuantScheme::fp8_rowwise ? Tensor(DType::f32, {experts, n})
                                                  : Tensor(DType::f32, {experts, nb, kb});
  poison(q.view());
  quantize_weights(scheme, ScaleFormat::f32, w.view(), q.view(), s.view());
  auto group_of = [&](std::int64_t e, std::int64_t r, std::int64_t c) {
    if (scheme == QuantScheme::fp8_tensor) return e;
    if (scheme == QuantScheme::fp8_rowwise) return e * n + r;
    return (e * nb + r / kBlock) * kb + c / kBlock;
  };
  std::vector<float> amax(std::size_t(s.numel()), 0.0f);
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const std::int64_t e = i / (n * k), r = i / k % n, c = i % k;
    float& m = amax[std::size_t(group_of(e, r, c))];
    m = std::max(m, std::abs(w.ptr<float>()[i]));
  }
  for (std::int64_t g = 0; g < s.numel(); ++g)
    ASSERT_EQ(s.ptr<float>()[g], fp8_scale(amax[std::size_t(g)], ScaleFormat::f32)) << "group " << g;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const float scale = s.ptr<float>()[group_of(i / (n * k), i / k % n, i % k)];
    ASSERT_EQ(q.ptr<std::uint8_t>()[i], fp8_e4m3_encode(w.ptr<float>()[i] / scale)) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(, CoreQuantizeWeights,
                         ::testing::Values(QuantizeCase{QuantScheme::fp8_tensor, 3, 40, 24},
                                           QuantizeCase{QuantScheme::fp8_rowwise, 2, 40, 24},
                                           QuantizeCase{QuantScheme::fp8_block, 2, 256, 320},
                                           QuantizeCase{QuantScheme::fp8_block, 1, 200, 130}),
                         [](const auto& info) {
                           const QuantizeCase& c = info.param;
                           std::string s(to_string(c.scheme));
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s + "_E" + std::to_string(c.experts) + "_N" + std::to_string(c.n) + "_K" +
                                  std::to_string(c.k);
                         });

TEST(CoreQuantizeWeightsErrors, NameTheArgument) {
  Tensor w(DType::f32, {1, 8, 8}), q(DType::fp8_e4m3, {1, 8, 8}), s(DType::f32, {1, 1, 1}), bad(DType::f32, {1, 2, 1});
  auto message = [&](QuantScheme scheme, const TensorView& scales) {
    try {
      quantize_weights(scheme, ScaleFormat::f32, w.view(), q.view(), scales);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(QuantScheme::fp8_block, bad.view()).find("scales"), std::string::npos);
  EXPECT_NE(message(QuantScheme::bf16, s.view()).find("quant"), std::string::npos);
}

}  // namespace
}  // namespace moekit::test
