// cpu::quantize_rows: every scheme x scale format. The scales follow DESIGN §4's rule, every
// code is the encoding of x / scale, and the dequantized value is within half an fp8 step.
#include "cpu/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/rows.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::cpu {
namespace {

enum class Fill : std::uint8_t { normal, wide, zero_row };

struct QuantCase {
  QuantScheme scheme;
  ScaleFormat format;
  std::int64_t rows, cols;
  Fill fill = Fill::normal;
  float static_scale = 0.0f;  // fp8-tensor: > 0 is a static scale
};

std::string case_name(const QuantCase& c) {
  std::string s(to_string(c.scheme));
  std::replace(s.begin(), s.end(), '-', '_');
  s += c.static_scale > 0.0f ? "_static" : "";
  s += c.format == ScaleFormat::ue8m0 ? "_ue8m0" : "_f32";
  s += "_M" + std::to_string(c.rows) + "_K" + std::to_string(c.cols);
  if (c.fill == Fill::wide) s += "_wide";
  if (c.fill == Fill::zero_row) s += "_zero_row";
  return s;
}
void PrintTo(const QuantCase& c, std::ostream* os) { *os << case_name(c); }

// Values of widely different magnitudes per row, so row and group scales differ.
std::vector<float> make_input(const QuantCase& c, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_gain(-6.0f, 6.0f);
  std::vector<float> x(std::size_t(c.rows * c.cols));
  for (std::int64_t r = 0; r < c.rows; ++r) {
    const float row_gain = std::exp2(log_gain(rng));
    for (std::int64_t k = 0; k < c.cols; ++k) {
      float v = normal(rng) * row_gain;
      if (c.fill == Fill::wide) v *= std::exp2(log_gain(rng));
      if (c.fill == Fill::zero_row && r == 1) v = 0.0f;
      x[std::size_t(r * c.cols + k)] = v;
    }
  }
  return x;
}

// The scale rule written out: max(amax, 1e-10) / 448, rounded up to a power of two for ue8m0.
float expected_scale(float amax, ScaleFormat format) {
  const float s = std::max(amax, 1e-10f) / 448.0f;
  if (format == ScaleFormat::f32) return s;
  return float(std::exp2(std::ceil(std::log2(double(s)))));
}

float group_amax(const std::vector<float>& x, std::int64_t begin, std::int64_t end) {
  float m = 0.0f;
  for (std::int64_t i = begin; i < end; ++i) m = std::max(m, std::abs(x[std::size_t(i)]));
  return m;
}

class CpuQuantizeRows : public ::testing::TestWithParam<QuantCase> {};

TEST_P(CpuQuantizeRows, ScalesCodesAndError) {
  const QuantCase c = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<float> x = make_input(c, rng);

  Tensor q(activation_dtype(c.scheme), {c.rows, c.cols});
  Tensor s;
  if (c.scheme != QuantScheme::bf16) s = Tensor(DType::f32, scale_shape(c.scheme, c.rows, c.cols));
  test::poison(q.view());
  if (s.defined()) test::poison(s.view());
  quantize_rows({{c.scheme, c.format}, c.static_scale}, x.data(), c.rows, c.cols, {q.view(), s.view()});

  if (c.scheme == QuantScheme::bf16) {
    for (std::int64_t i = 0; i < c.rows * c.cols; ++i)
      ASSERT_EQ(q.ptr<bf16>()[i].bits, float_to_bf16(x[std::size_t(i)]).bits) << "element " << i;
    return;
  }

  // The group of K each scale covers, and where its scale lies.
  const std::int64_t group = c.scheme == QuantScheme::fp8_block ? kBlock : c.cols;
  const std::int64_t groups = ceil_div(c.cols, group);
  auto scale_index = [&](std::int64_t r, std::int64_t g) -> std::int64_t {
    switch (c.scheme) {
      case QuantScheme::fp8_tensor: return 0;
      case QuantScheme::fp8_rowwise: return r;
      default: return r * groups + g;
    }
  };
  ASSERT_EQ(s.numel(), c.scheme == QuantScheme::fp8_tensor ? 1
                       : c.scheme == QuantScheme::fp8_rowwise ? c.rows
                                                              : c.rows * groups);
  const float tensor_amax = group_amax(x, 0, c.rows * c.cols);
  for (std::int64_t r = 0; r < c.rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t begin = r * c.cols + g * group;
      const std::int64_t end = r * c.cols + std::min(c.cols, (g + 1) * group);
      float want = 0.0f;
      if (c.scheme == QuantScheme::fp8_tensor)
        want = c.static_scale > 0.0f ? c.static_scale : expected_scale(tensor_amax, c.format);
      else
        want = expected_scale(group_amax(x, begin, end), c.format);
      const float scale = s.ptr<float>()[scale_index(r, g)];
      ASSERT_EQ(scale, want) << "row " << r << " group " << g;
      for (std::int64_t i = begin; i < end; ++i) {
        const float v = x[std::size_t(i)];
        const std::uint8_t code = q.ptr<std::uint8_t>()[i];
        ASSERT_EQ(int(code), int(fp8_e4m3_encode(v / scale))) << "element " << i << " value " << v;
        const double back = double(fp8_e4m3_decode(code)) * scale;
        // Saturation (a static scale smaller than amax / 448) is the only way out of the bound.
        if (std::abs(v / scale) >= 448.0f) {
          EXPECT_EQ(std::abs(back), 448.0 * scale);
          continue;
        }
        // Half a step: 2^-4 relative in the normal range, 2^-10 * scale among subnormals.
        const double bound = (std::abs(double(v)) * 0.0625 + std::ldexp(double(scale), -10)) * (1 + 1e-6);
        ASSERT_LE(std::abs(back - v), bound) << "element " << i << " value " << v;
      }
    }
  }
}

std::vector<QuantCase> quant_cases() {
  std::vector<QuantCase> cases;
  for (ScaleFormat f : {ScaleFormat::f32, ScaleFormat::ue8m0}) {
    cases.push_back({QuantScheme::fp8_tensor, f, 5, 96});
    cases.push_back({QuantScheme::fp8_tensor, f, 3, 200, Fill::wide});
    cases.push_back({QuantScheme::fp8_rowwise, f, 6, 80});
    cases.push_back({QuantScheme::fp8_rowwise, f, 4, 130, Fill::zero_row});
    cases.push_back({QuantScheme::fp8_block, f, 4, 256});
    cases.push_back({QuantScheme::fp8_block, f, 5, 200});   // partial last group of 72
    cases.push_back({QuantScheme::fp8_block, f, 3, 144, Fill::wide});
    cases.push_back({QuantScheme::fp8_block, f, 3, 48, Fill::zero_row});  // one partial group
  }
  cases.push_back({QuantScheme::fp8_tensor, ScaleFormat::f32, 4, 64, Fill::normal, 0.02f});
  cases.push_back({QuantScheme::fp8_tensor, ScaleFormat::f32, 4, 64, Fill::wide, 1e-4f});  // saturates
  cases.push_back({QuantScheme::bf16, ScaleFormat::f32, 7, 100});
  cases.push_back({QuantScheme::fp8_block, ScaleFormat::f32, 0, 256});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(, CpuQuantizeRows, ::testing::ValuesIn(quant_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(CpuQuantHelpers, AmaxAndQuantizeWithScale) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(300);
  for (float& v : x) v = normal(rng);
  EXPECT_EQ(amax(x.data(), 300), group_amax(x, 0, 300));
  EXPECT_EQ(amax(x.data(), 0), 0.0f);
  std::vector<std::uint8_t> q(301, 0xab);
  quantize_with_scale(x.data(), 300, 0.01f, q.data());
  for (std::size_t i = 0; i < 300; ++i) ASSERT_EQ(int(q[i]), int(fp8_e4m3_encode(x[i] / 0.01f)));
  EXPECT_EQ(q[300], 0xab) << "wrote past the end";
}

TEST(CpuQuantHelpers, DecodeTableMatchesDecode) {
  const float* table = fp8_decode_table();
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_decode(std::uint8_t(c));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(table[c]));
    } else {
      EXPECT_EQ(std::memcmp(&v, &table[c], sizeof v), 0) << "code " << c;
    }
  }
}

}  // namespace
}  // namespace moekit::cpu
