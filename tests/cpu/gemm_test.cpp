// cpu::grouped_gemm against a plain f64 GEMM written here: dequantize A and W with their
// scales (DESIGN §4's layouts), sum in double. Only the bf16 output rounding and f32
// accumulation separate the two, so every element is held to that.
#include "cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/rows.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::cpu {
namespace {

struct GemmCase {
  QuantScheme scheme;
  std::vector<std::int64_t> rows_per_expert;
  std::int64_t n, k;
};

std::string case_name(const GemmCase& c) {
  std::string s(to_string(c.scheme));
  std::replace(s.begin(), s.end(), '-', '_');
  s += "_E" + std::to_string(c.rows_per_expert.size()) + "_rows";
  for (std::size_t e = 0; e < c.rows_per_expert.size(); ++e) s += (e ? "_" : "") + std::to_string(c.rows_per_expert[e]);
  return s + "_N" + std::to_string(c.n) + "_K" + std::to_string(c.k);
}
void PrintTo(const GemmCase& c, std::ostream* os) { *os << case_name(c); }

// Values near N(0, 1) as the scheme stores them (fp8 codes or bf16).
void fill_values(Tensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = normal(rng) * 4.0f;
    if (t.dtype() == DType::bf16) t.ptr<bf16>()[i] = float_to_bf16(v);
    else t.ptr<std::uint8_t>()[i] = fp8_e4m3_encode(v);
  }
}

// Positive scales spread over two octaves, so a wrong scale index changes the result.
void fill_scales(Tensor& t, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(0.01f, 0.04f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
}

double value_at(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::bf16 ? double(bf16_to_float(t.ptr<bf16>()[i]))
                                  : double(fp8_e4m3_decode(t.ptr<std::uint8_t>()[i]));
}

struct Problem {
  GemmCase c;
  std::int64_t m = 0;
  std::vector<std::int64_t> offsets;  // [E + 1]
  Tensor a, a_scales;                 // [M, K], per scheme
  Tensor w, w_scales;                 // [E, N, K], per scheme
};

Problem make_problem(const GemmCase& c, std::mt19937_64& rng) {
  Problem p;
  p.c = c;
  const auto experts = std::int64_t(c.rows_per_expert.size());
  p.offsets.assign(std::size_t(experts + 1), 0);
  std::partial_sum(c.rows_per_expert.begin(), c.rows_per_expert.end(), p.offsets.begin() + 1);
  p.m = p.offsets.back();
  const DType dtype = activation_dtype(c.scheme);
  p.a = Tensor(dtype, {p.m, c.k});
  p.w = Tensor(dtype, {experts, c.n, c.k});
  fill_values(p.a, rng);
  fill_values(p.w, rng);
  const std::int64_t kb = ceil_div(c.k, kBlock), nb = ceil_div(c.n, kBlock);
  switch (c.scheme) {
    case QuantScheme::bf16: return p;
    case QuantScheme::fp8_tensor:
      p.a_scales = Tensor(DType::f32, {1});
      p.w_scales = Tensor(DType::f32, {experts});
      break;
    case QuantScheme::fp8_rowwise:
      p.a_scales = Tensor(DType::f32, {p.m});
      p.w_scales = Tensor(DType::f32, {experts, c.n});
      break;
    case QuantScheme::fp8_block:
      p.a_scales = Tensor(DType::f32, {p.m, kb});
      p.w_scales = Tensor(DType::f32, {experts, nb, kb});
      break;
  }
  fill_scales(p.a_scales, rng);
  fill_scales(p.w_scales, rng);
  return p;
}

// Real value of A[m, k] and of W[e, n, k] with the scale layouts of DESIGN §4.
double a_real(const Problem& p, std::int64_t m, std::int64_t k) {
  const double q = value_at(p.a, m * p.c.k + k);
  const float* s = p.a_scales.defined() ? p.a_scales.ptr<float>() : nullptr;
  switch (p.c.scheme) {
    case QuantScheme::bf16: return q;
    case QuantScheme::fp8_tensor: return q * s[0];
    case QuantScheme::fp8_rowwise: return q * s[m];
    case QuantScheme::fp8_block: return q * s[m * ceil_div(p.c.k, kBlock) + k / kBlock];
  }
  return NAN;
}

double w_real(const Problem& p, std::int64_t e, std::int64_t n, std::int64_t k) {
  const double q = value_at(p.w, (e * p.c.n + n) * p.c.k + k);
  const float* s = p.w_scales.defined() ? p.w_scales.ptr<float>() : nullptr;
  const std::int64_t kb = ceil_div(p.c.k, kBlock), nb = ceil_div(p.c.n, kBlock);
  switch (p.c.scheme) {
    case QuantScheme::bf16: return q;
    case QuantScheme::fp8_tensor: return q * s[e];
    case QuantScheme::fp8_rowwise: return q * s[e * p.c.n + n];
    case QuantScheme::fp8_block: return q * s[(e * nb + n / kBlock) * kb + k / kBlock];
  }
  return NAN;
}

class CpuGroupedGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuGroupedGemm, MatchesF64) {
  const GemmCase c = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem p = make_problem(c, rng);

  // One spare row after the M rows: nothing may be written there.
  Tensor out(DType::bf16, {p.m + 1, c.n});
  test::poison(out.view());
  GroupedGemmArgs args;
  args.scheme = c.scheme;
  args.a = {p.a.view(), p.a_scales.view()};
  args.offsets = p.offsets.data();
  args.weights = p.w.view();
  args.weight_scales = p.w_scales.view();
  args.out = out.ptr<bf16>();
  grouped_gemm(args);

  for (std::int64_t e = 0; e + 1 < std::int64_t(p.offsets.size()); ++e) {
    for (std::int64_t m = p.offsets[std::size_t(e)]; m < p.offsets[std::size_t(e) + 1]; ++m) {
      std::vector<double> a(std::size_t(c.k));
      for (std::int64_t k = 0; k < c.k; ++k) a[std::size_t(k)] = a_real(p, m, k);
      double err2 = 0.0, ref2 = 0.0;
      for (std::int64_t n = 0; n < c.n; ++n) {
        double ref = 0.0, abs_sum = 0.0;
        for (std::int64_t k = 0; k < c.k; ++k) {
          const double term = a[std::size_t(k)] * w_real(p, e, n, k);
          ref += term;
          abs_sum += std::abs(term);
        }
        const double got = bf16_to_float(out.ptr<bf16>()[m * c.n + n]);
        // bf16 rounding is half a step (2^-9 relative); f32 sums of K terms add a little.
        const double bound = std::ldexp(std::abs(ref), -8) + 4e-5 * abs_sum + 1e-30;
        ASSERT_LE(std::abs(got - ref), bound) << "expert " << e << " row " << m << " col " << n
                                              << ": " << got << " vs " << ref;
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
      }
      EXPECT_LE(std::sqrt(err2), 1e-2 * std::sqrt(ref2)) << "row " << m;
    }
  }
  for (std::int64_t n = 0; n < c.n; ++n)
    ASSERT_EQ(out.ptr<bf16>()[p.m * c.n + n].bits, 0xffff) << "wrote past row M at column " << n;
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                        QuantScheme::fp8_block}) {
    cases.push_back({s, {0, 9, 0}, 272, 144});       // one expert has all rows; partial N and K blocks
    cases.push_back({s, {3, 0, 5, 1}, 160, 256});    // an empty expert in the middle
    cases.push_back({s, {0, 1}, 48, 64});            // one row, on the last expert
    cases.push_back({s, {2}, 16, 16});               // minimal N and K
    cases.push_back({s, {1, 2, 0, 3, 1}, 64, 272});  // three K blocks, the last partial
    cases.push_back({s, {0, 0}, 32, 32});            // no rows at all
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuGroupedGemm, ::testing::ValuesIn(gemm_cases()),
                         [](const auto& info) { return case_name(info.param); });

// gemm_row on a column range writes exactly [n0, n1).
TEST(CpuGemmRow, WritesOnlyItsColumns) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem p = make_problem({QuantScheme::fp8_block, {1}, 300, 144}, rng);
  std::vector<bf16> full(300), part(300);
  const QuantizedRows a{p.a.view(), p.a_scales.view()};
  const ExpertMatrix w = expert_matrix(p.w.view(), p.w_scales.view(), QuantScheme::fp8_block, 0);
  EXPECT_EQ(w.n, 300);
  EXPECT_EQ(w.k, 144);
  gemm_row(QuantScheme::fp8_block, activation_row(a, QuantScheme::fp8_block, 0), w, 0, 300, full.data());
  test::poison(TensorView::contiguous(part.data(), DType::bf16, {300}));
  gemm_row(QuantScheme::fp8_block, activation_row(a, QuantScheme::fp8_block, 0), w, 70, 201, part.data());
  for (std::int64_t n = 0; n < 300; ++n) {
    if (n >= 70 && n < 201) EXPECT_EQ(part[std::size_t(n)].bits, full[std::size_t(n)].bits) << "column " << n;
    else EXPECT_EQ(part[std::size_t(n)].bits, 0xffff) << "column " << n;
  }
}

}  // namespace
}  // namespace moekit::cpu
