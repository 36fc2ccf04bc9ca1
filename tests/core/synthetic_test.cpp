// Synthetic layers (src/core/synthetic.h): the quantized weights are the master weights
// quantized by DESIGN §4's rules, every EP rank generates the same global experts, and
// everything is a pure function of the seed.
#include "core/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/master_weights.h"
#include "moekit/error.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::core {
namespace {

struct SyntheticCase {
  QuantScheme scheme;
  ScaleFormat format;
  Activation activation;
};
std::string case_name(const SyntheticCase& c) {
  std::string s(to_string(c.scheme));
  std::replace(s.begin(), s.end(), '-', '_');
  return s + "_" + std::string(to_string(c.format)) + "_" + std::string(to_string(c.activation));
}
void PrintTo(const SyntheticCase& c, std::ostream* os) { *os << case_name(c); }

MoEConfig config_of(const SyntheticCase& c) {
  MoEConfig m;
  m.num_experts = 4;
  m.hidden_size = 144;        // a partial K block for w13, a partial N block for w2
  m.intermediate_size = 128;
  m.activation = c.activation;
  m.quant = {c.scheme, c.format};
  m.routing.top_k = 2;
  m.routing.method = RoutingMethod::sigmoid_bias_renorm;  // so the layer has a bias
  return m;
}

class CoreSynthetic : public ::testing::TestWithParam<SyntheticCase> {};

// Recomputes every scale and code of one projection from the master weights.
void check_projection(const MoEConfig& c, const SyntheticLayer& l, Projection p) {
  const bool w13 = p == Projection::w13;
  const Tensor& values = w13 ? l.w13 : l.w2;
  const Tensor& scales = w13 ? l.w13_scale : l.w2_scale;
  const std::int64_t n_rows = values.size(1), k = values.size(2);
  const SyntheticMaster master(c, l.seed);
  const QuantScheme scheme = c.quant.scheme;
  const std::int64_t nb = ceil_div(n_rows, kBlock), kb = ceil_div(k, kBlock);
  for (std::int64_t e = 0; e < c.local_experts(); ++e) {
    std::vector<float> m(std::size_t(n_rows * k));  // the expert's master matrix, as f32
    std::vector<double> row(static_cast<std::size_t>(k));
    for (std::int64_t n = 0; n < n_rows; ++n) {
      master.row(p, e, n, row.data());
      for (std::int64_t i = 0; i < k; ++i) m[std::size_t(n * k + i)] = float(row[std::size_t(i)]);
    }
    auto amax = [&](std::int64_t n0, std::int64_t n1, std::int64_t k0, std::int64_t k1) {
      float a = 0.0f;
      for (std::int64_t n = n0; n < std::min(n1, n_rows); ++n)
        for (std::int64_t i = k0; i < std::min(k1, k); ++i) a = std::max(a, std::abs(m[std::size_t(n * k + i)]));
      return a;
    };
    for (std::int64_t n = 0; n < n_rows; ++n) {
      for (std::int64_t i = 0; i < k; ++i) {
        const std::int64_t at = (e * n_rows + n) * k + i;
        const float x = m[std::size_t(n * k + i)];
        if (scheme == QuantScheme::bf16) {
          ASSERT_EQ(values.ptr<bf16>()[at].bits, float_to_bf16(x).bits) << "expert " << e << " row " << n;
          continue;
        }
        float scale = 0.0f;
        if (scheme == QuantScheme::fp8_tensor) {
          scale = scales.ptr<float>()[e];
          if (n == 0 && i == 0) {
            ASSERT_EQ(scale, fp8_scale(amax(0, n_rows, 0, k), c.quant.scale_format));
          }
        } else if (scheme == QuantScheme::fp8_rowwise) {
          scale = scales.ptr<float>()[e * n_rows + n];
          if (i == 0) {
            ASSERT_EQ(scale, fp8_scale(amax(n, n + 1, 0, k), c.quant.scale_format)) << "row " << n;
          }
        } else {
          const std::int64_t bn = n / kBlock, bk = i / kBlock;
          scale = scales.ptr<float>()[(e * nb + bn) * kb + bk];
          if (n % kBlock == 0 && i % kBlock == 0) {
            ASSERT_EQ(scale, fp8_scale(amax(bn * kBlock, (bn + 1) * kBlock, bk * kBlock, (bk + 1) * kBlock),
                                       c.quant.scale_format))
                << "block " << bn << ", " << bk;
          }
        }
        ASSERT_EQ(int(values.ptr<std::uint8_t>()[at]), int(fp8_e4m3_encode(x / scale)))
            << "expert " << e << " row " << n << " col " << i;
      }
    }
  }
}

TEST_P(CoreSynthetic, WeightsAreTheMasterQuantized) {
  const SyntheticCase sc = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = config_of(sc);
  const SyntheticLayer l = make_synthetic_layer(c, seed);
  EXPECT_EQ(l.w13.shape(), (std::vector<std::int64_t>{4, c.gemm1_width(), 144}));
  EXPECT_EQ(l.w2.shape(), (std::vector<std::int64_t>{4, 144, 128}));
  check_projection(c, l, Projection::w13);
  check_projection(c, l, Projection::w2);
  ASSERT_TRUE(l.e_score_correction_bias.defined());
  EXPECT_EQ(l.e_score_correction_bias.shape(), (std::vector<std::int64_t>{4}));
  // DequantizedWeights reads back q * scale.
  const DequantizedWeights deq(c, l.weights());
  std::vector<double> row(144), master_row(144);
  const SyntheticMaster master(c, seed);
  for (std::int64_t e = 0; e < 4; ++e) {
    deq.row(Projection::w2, e, 130, row.data());
    master.row(Projection::w2, e, 130, master_row.data());
    for (std::size_t i = 0; i < 128; ++i) {
      const double tol = sc.scheme == QuantScheme::bf16 ? std::ldexp(std::abs(master_row[i]), -8) * 1.01
                                                         : std::abs(master_row[i]) * 0.0626 + 2e-6;  // half an fp8 step
      ASSERT_NEAR(row[i], master_row[i], tol) << "expert " << e << " col " << i;
    }
  }
}

TEST_P(CoreSynthetic, EpRanksGenerateTheSameExperts) {
  const SyntheticCase sc = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = config_of(sc);
  const SyntheticLayer full = make_synthetic_layer(c, seed);
  c.ep_size = 2, c.ep_rank = 1;
  const SyntheticLayer rank1 = make_synthetic_layer(c, seed);
  // Rank 1 holds global experts 2 and 3: the second half of every per-expert tensor.
  for (auto [a, b] : {std::pair{&full.w13, &rank1.w13}, std::pair{&full.w2, &rank1.w2},
                      std::pair{&full.w13_scale, &rank1.w13_scale}, std::pair{&full.w2_scale, &rank1.w2_scale}}) {
    if (!a->defined()) continue;
    ASSERT_EQ(b->nbytes() * 2, a->nbytes());
    EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(a->view().data) + b->nbytes(), b->view().data, b->nbytes()), 0);
  }
  EXPECT_EQ(std::memcmp(full.e_score_correction_bias.view().data, rank1.e_score_correction_bias.view().data, full.e_score_correction_bias.nbytes()), 0);
  // The same seed again gives the same bytes; another seed does not.
  c.ep_size = 1, c.ep_rank = 0;
  const SyntheticLayer again = make_synthetic_layer(c, seed), other = make_synthetic_layer(c, seed + 1);
  EXPECT_EQ(std::memcmp(full.w13.view().data, again.w13.view().data, full.w13.nbytes()), 0);
  EXPECT_NE(std::memcmp(full.w13.view().data, other.w13.view().data, full.w13.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(, CoreSynthetic,
                         ::testing::Values(SyntheticCase{QuantScheme::bf16, ScaleFormat::f32, Activation::silu_and_mul},
                                           SyntheticCase{QuantScheme::fp8_tensor, ScaleFormat::f32, Activation::silu_and_mul},
                                           SyntheticCase{QuantScheme::fp8_rowwise, ScaleFormat::ue8m0, Activation::relu2},
                                           SyntheticCase{QuantScheme::fp8_block, ScaleFormat::f32, Activation::silu_and_mul},
                                           SyntheticCase{QuantScheme::fp8_block, ScaleFormat::ue8m0, Activation::relu2}),
                         [](const auto& info) { return case_name(info.param); });

TEST(CoreSyntheticInputs, HiddenAndLogitsLookNormal) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Tensor h = make_hidden(64, 96, seed);
  const Tensor f = make_router_logits(64, 12, DType::f32, seed);
  const Tensor b = make_router_logits(64, 12, DType::bf16, seed);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(h.shape(), (std::vector<std::int64_t>{64, 96}));
  double sum = 0.0, sum2 = 0.0;
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    const double v = bf16_to_float(h.ptr<bf16>()[i]);
    ASSERT_TRUE(std::isfinite(v));
    sum += v, sum2 += v * v;
  }
  const double mean = sum / double(h.numel()), var = sum2 / double(h.numel()) - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(var, 1.0, 0.15);
  // The bf16 logits are the f32 ones rounded; the same seed gives the same values.
  for (std::int64_t i = 0; i < f.numel(); ++i)
    ASSERT_EQ(b.ptr<bf16>()[i].bits, float_to_bf16(f.ptr<float>()[i]).bits);
  const Tensor h2 = make_hidden(64, 96, seed);
  EXPECT_EQ(std::memcmp(h.view().data, h2.view().data, h.nbytes()), 0);
}

// Issue #19: sizes each valid whose product does not fit are an Error naming the weight.
TEST(CoreSyntheticSizes, ProductThatOverflowsAreAnErrorNamingTheWeight) {
  MoEConfig c;
  c.num_experts = std::int64_t(1) << 40;
  c.hidden_size = std::int64_t(1) << 20;
  c.intermediate_size = std::int64_t(1) << 20;
  c.routing.top_k = 2;
  try {
    make_synthetic_layer(c, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic w13 [E_local, 2I, H]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit::core
