#include "cpu/quant.h"

#include <array>
#include <cmath>
#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit {
namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Decoding by the format's definition: bias 7, 3 mantissa bits, subnormals below 2^-6,
// S.1111.111 is NaN, no infinities.
float decode_by_definition(std::uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)
                                        : std::ldexp(float(8 + mantissa), exponent - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

std::array<float, 256> make_decode_table() {
  std::array<float, 256> table{};
  for (int c = 0; c < 256; ++c) table[std::size_t(c)] = decode_by_definition(std::uint8_t(c));
  return table;
}

const std::array<float, 256> kDecodeTable = make_decode_table();

}  // namespace

std::uint8_t fp8_e4m3_encode(float x) {
  const std::uint32_t bits = float_bits(x);
  const std::uint8_t sign = std::uint8_t((bits >> 24) & 0x80);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7f;                     // NaN
  if (magnitude >= float_bits(kFp8Max)) return sign | 0x7e;            // saturate to 448
  if (magnitude >= float_bits(0.015625f)) {                            // normal: >= 2^-6
    // Round the f32 mantissa to 3 bits, nearest even; a carry moves into the exponent.
    const std::uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
    return sign | std::uint8_t((rounded >> 20) - ((127 - 7) << 3));
  }
  // Subnormal steps of 2^-9; x * 2^9 is exact, so one nearest-even rounding decides.
  float a;
  std::memcpy(&a, &magnitude, sizeof a);
  return sign | std::uint8_t(std::nearbyint(a * 512.0f));
}

float fp8_e4m3_decode(std::uint8_t code) { return kDecodeTable[code]; }

float fp8_scale(float amax, ScaleFormat format) {
  const float scale = std::fmax(amax, kMinAmax) / kFp8Max;
  if (format == ScaleFormat::f32) return scale;
  int exponent = 0;
  const float mantissa = std::frexp(scale, &exponent);  // scale = mantissa * 2^exponent
  return mantissa == 0.5f ? scale : std::ldexp(1.0f, exponent);
}

}  // namespace moekit

namespace moekit::cpu {

const float* fp8_decode_table() { return kDecodeTable.data(); }

float amax(const float* x, std::int64_t n) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

void quantize_with_scale(const float* x, std::int64_t n, float scale, std::uint8_t* q) {
  for (std::int64_t i = 0; i < n; ++i) q[i] = fp8_e4m3_encode(x[i] / scale);
}

void quantize_rows(const QuantizeParams& params, const float* x, std::int64_t rows, std::int64_t cols,
                   const QuantizedRows& out) {
  const QuantScheme scheme = params.quant.scheme;
  const ScaleFormat format = params.quant.scale_format;
  if (scheme == QuantScheme::bf16) {
    bf16* q = out.q.ptr<bf16>();
    core::parallel_for(rows * cols, 1 << 14, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) q[i] = float_to_bf16(x[i]);
    });
    return;
  }
  std::uint8_t* q = out.q.ptr<std::uint8_t>();
  float* scales = out.scales.ptr<float>();
  if (scheme == QuantScheme::fp8_tensor) {
    float scale = params.static_scale;
    if (scale <= 0.0f) scale = fp8_scale(amax(x, rows * cols), format);
    scales[0] = scale;
    core::parallel_for(rows, 16, [&](std::int64_t b, std::int64_t e) {
      quantize_with_scale(x + b * cols, (e - b) * cols, scale, q + b * cols);
    });
    return;
  }
  const std::int64_t group = scheme == QuantScheme::fp8_block ? kBlock : cols;
  const std::int64_t groups = ceil_div(cols, group);
  core::parallel_for(rows, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::int64_t begin = g * group;
        const std::int64_t n = std::min(group, cols - begin);
        const float scale = fp8_scale(amax(x + r * cols + begin, n), format);
        scales[r * groups + g] = scale;
        quantize_with_scale(x + r * cols + begin, n, scale, q + r * cols + begin);
      }
    }
  });
}

}  // namespace moekit::cpu
