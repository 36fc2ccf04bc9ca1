// FP8 e4m3fn codec (DESIGN §4): decode and encode against golden vectors, then the rules
// one case at a time (round to nearest even, saturate to ±448, NaN stays NaN), and the scale rule.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit {
namespace {

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// The golden file: decode_codes u8[256], decode_values f32[256], encode_in f32[N], encode_out u8[N].
struct Golden {
  Tensor decode_codes, decode_values, encode_in, encode_out;
};

Golden read_golden() {
  const io::SafetensorsReader r(test::data_path("golden/fp8_e4m3fn.safetensors"));
  return {r.read("decode_codes"), r.read("decode_values"), r.read("encode_in"), r.read("encode_out")};
}

TEST(CpuFp8Golden, DecodeEveryCodeBitExact) {
  const Golden g = read_golden();
  ASSERT_EQ(g.decode_codes.numel(), 256);
  ASSERT_EQ(g.decode_values.numel(), 256);
  int nans = 0;
  for (int i = 0; i < 256; ++i) {
    const std::uint8_t code = g.decode_codes.ptr<std::uint8_t>()[i];
    const float want = g.decode_values.ptr<float>()[i];
    const float got = fp8_e4m3_decode(code);
    SCOPED_TRACE("code 0x" + std::to_string(code));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got));
      EXPECT_EQ(code & 0x7f, 0x7f);
    } else {
      EXPECT_EQ(bits_of(got), bits_of(want)) << got << " vs " << want;
    }
  }
  EXPECT_EQ(nans, 2);
}

TEST(CpuFp8Golden, EncodeBitExact) {
  const Golden g = read_golden();
  ASSERT_EQ(g.encode_in.numel(), g.encode_out.numel());
  ASSERT_GT(g.encode_in.numel(), 40000);
  int wrong = 0;
  for (std::int64_t i = 0; i < g.encode_in.numel(); ++i) {
    const float x = g.encode_in.ptr<float>()[i];
    const std::uint8_t want = g.encode_out.ptr<std::uint8_t>()[i];
    const std::uint8_t got = fp8_e4m3_encode(x);
    if (got != want && ++wrong <= 10)
      ADD_FAILURE() << "encode(" << x << ") = 0x" << std::hex << int(got) << ", expected 0x" << int(want);
  }
  EXPECT_EQ(wrong, 0);
}

struct EncodeCase {
  std::string name;
  float x;
  std::uint8_t code;
};
void PrintTo(const EncodeCase& c, std::ostream* os) { *os << c.name; }

class CpuFp8Encode : public ::testing::TestWithParam<EncodeCase> {};

TEST_P(CpuFp8Encode, GivesTheCode) {
  const EncodeCase& c = GetParam();
  EXPECT_EQ(int(fp8_e4m3_encode(c.x)), int(c.code)) << "x = " << c.x;
  // The sign is the only difference between x and -x (NaN aside, which has its own case).
  if (!std::isnan(c.x)) {
    EXPECT_EQ(int(fp8_e4m3_encode(-c.x)), int(c.code ^ 0x80)) << "x = " << -c.x;
  }
}

const float kInf = std::numeric_limits<float>::infinity();
const float kSub = std::ldexp(1.0f, -9);  // the smallest subnormal

INSTANTIATE_TEST_SUITE_P(
    , CpuFp8Encode,
    ::testing::Values(
        EncodeCase{"zero", 0.0f, 0x00},
        EncodeCase{"one", 1.0f, 0x38},
        EncodeCase{"smallest_subnormal", kSub, 0x01},
        EncodeCase{"half_smallest_subnormal_ties_to_zero", kSub / 2, 0x00},
        EncodeCase{"just_above_half_subnormal", std::nextafter(kSub / 2, 1.0f), 0x01},
        EncodeCase{"quarter_subnormal", kSub / 4, 0x00},
        EncodeCase{"subnormal_tie_1p5_to_even_2", 1.5f * kSub, 0x02},
        EncodeCase{"subnormal_tie_2p5_to_even_2", 2.5f * kSub, 0x02},
        EncodeCase{"subnormal_tie_3p5_to_even_4", 3.5f * kSub, 0x04},
        EncodeCase{"largest_subnormal", 7.0f * kSub, 0x07},
        EncodeCase{"tie_subnormal_normal_to_even_min_normal", 7.5f * kSub, 0x08},
        EncodeCase{"min_normal", std::ldexp(1.0f, -6), 0x08},
        EncodeCase{"below_min_normal", std::nextafter(std::ldexp(1.0f, -6), 0.0f), 0x08},
        EncodeCase{"normal_tie_1p0625_to_even_1", 1.0625f, 0x38},
        EncodeCase{"normal_tie_1p1875_to_even_1p25", 1.1875f, 0x3a},
        EncodeCase{"normal_above_tie_rounds_up", std::nextafter(1.0625f, 2.0f), 0x39},
        EncodeCase{"normal_below_tie_rounds_down", std::nextafter(1.1875f, 0.0f), 0x39},
        EncodeCase{"carry_into_exponent", 1.9375f, 0x40},
        EncodeCase{"416", 416.0f, 0x7d},
        EncodeCase{"tie_416_448_to_even_448", 432.0f, 0x7e},
        EncodeCase{"448_max", 448.0f, 0x7e},
        EncodeCase{"between_448_and_464", 460.0f, 0x7e},
        EncodeCase{"464_saturates", 464.0f, 0x7e},
        EncodeCase{"1000_saturates", 1000.0f, 0x7e},
        EncodeCase{"1e30_saturates", 1e30f, 0x7e},
        EncodeCase{"max_float_saturates", std::numeric_limits<float>::max(), 0x7e},
        EncodeCase{"inf_saturates", kInf, 0x7e}),
    [](const auto& info) { return info.param.name; });

TEST(CpuFp8EncodeSpecial, NegativeZeroKeepsItsSign) {
  EXPECT_EQ(int(fp8_e4m3_encode(-0.0f)), 0x80);
  EXPECT_TRUE(std::signbit(fp8_e4m3_decode(0x80)));
  EXPECT_EQ(fp8_e4m3_decode(0x80), 0.0f);
}

TEST(CpuFp8EncodeSpecial, NanGivesANanCode) {
  for (const float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN()}) {
    const std::uint8_t code = fp8_e4m3_encode(nan);
    EXPECT_EQ(code & 0x7f, 0x7f) << "code 0x" << std::hex << int(code);
    EXPECT_TRUE(std::isnan(fp8_e4m3_decode(code)));
  }
  EXPECT_EQ(int(fp8_e4m3_encode(-kInf)), 0xfe);
}

TEST(CpuFp8EncodeSpecial, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = std::uint8_t(c);
    const float v = fp8_e4m3_decode(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    EXPECT_EQ(int(fp8_e4m3_encode(v)), c) << "value " << v;
    EXPECT_EQ(bits_of(fp8_e4m3_decode(fp8_e4m3_encode(v))), bits_of(v)) << "code " << c;
  }
}

// Random values between two neighbouring codes go to the nearer one (ties are covered above).
TEST(CpuFp8EncodeSpecial, RandomValuesGoToTheNearestCode) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_decode(std::uint8_t(c)), hi = fp8_e4m3_decode(std::uint8_t(c + 1));
    for (int i = 0; i < 20; ++i) {
      const float x = lo + (hi - lo) * unit(rng);
      if (x - lo == hi - x) continue;
      const int want = (x - lo < hi - x) ? c : c + 1;
      EXPECT_EQ(int(fp8_e4m3_encode(x)), want) << "x = " << x;
      EXPECT_EQ(int(fp8_e4m3_encode(-x)), want | 0x80) << "x = " << -x;
    }
  }
}

struct ScaleCase {
  std::string name;
  float amax;
  ScaleFormat format;
  float scale;
};
void PrintTo(const ScaleCase& c, std::ostream* os) { *os << c.name; }

class CpuFp8Scale : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(CpuFp8Scale, FollowsTheRule) {
  const ScaleCase& c = GetParam();
  EXPECT_EQ(bits_of(fp8_scale(c.amax, c.format)), bits_of(c.scale))
      << fp8_scale(c.amax, c.format) << " vs " << c.scale;
}

INSTANTIATE_TEST_SUITE_P(
    , CpuFp8Scale,
    ::testing::Values(ScaleCase{"f32_448", 448.0f, ScaleFormat::f32, 1.0f},
                      ScaleCase{"f32_1", 1.0f, ScaleFormat::f32, 1.0f / 448.0f},
                      ScaleCase{"f32_3p5", 3.5f, ScaleFormat::f32, 3.5f / 448.0f},
                      ScaleCase{"f32_zero_uses_min_amax", 0.0f, ScaleFormat::f32, 1e-10f / 448.0f},
                      ScaleCase{"f32_tiny_uses_min_amax", 1e-20f, ScaleFormat::f32, 1e-10f / 448.0f},
                      ScaleCase{"ue8m0_448_stays_1", 448.0f, ScaleFormat::ue8m0, 1.0f},
                      ScaleCase{"ue8m0_896_stays_2", 896.0f, ScaleFormat::ue8m0, 2.0f},
                      ScaleCase{"ue8m0_224_stays_half", 224.0f, ScaleFormat::ue8m0, 0.5f},
                      ScaleCase{"ue8m0_449_up_to_2", 449.0f, ScaleFormat::ue8m0, 2.0f},
                      ScaleCase{"ue8m0_1_up_to_2_pow_minus8", 1.0f, ScaleFormat::ue8m0, std::ldexp(1.0f, -8)},
                      ScaleCase{"ue8m0_447_up_to_1", 447.0f, ScaleFormat::ue8m0, 1.0f},
                      ScaleCase{"ue8m0_zero", 0.0f, ScaleFormat::ue8m0, std::ldexp(1.0f, -42)}),
    [](const auto& info) { return info.param.name; });

TEST(CpuFp8ScaleRandom, Ue8m0IsTheNextPowerOfTwo) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> log_amax(-20.0f, 20.0f);
  for (int i = 0; i < 2000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    const float s = fp8_scale(amax, ScaleFormat::f32);
    EXPECT_EQ(s, amax / 448.0f);
    const float p = fp8_scale(amax, ScaleFormat::ue8m0);
    int exponent = 0;
    EXPECT_EQ(std::frexp(p, &exponent), 0.5f) << p << " is not a power of two";
    EXPECT_GE(p, s);
    EXPECT_LT(p, 2.0f * s);
    // An exact power of two stays as it is.
    EXPECT_EQ(fp8_scale(448.0f * p, ScaleFormat::ue8m0), p);
  }
}

}  // namespace
}  // namespace moekit
