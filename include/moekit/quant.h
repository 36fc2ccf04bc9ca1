// FP8 e4m3fn codec and the scale rule of DESIGN §4.
#pragma once

#include <cstdint>

#include "moekit/config.h"

namespace moekit {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kMinAmax = 1e-10f;

// Round to nearest even, saturate to ±448, NaN stays NaN (CUDA's __NV_SATFINITE, e4m3).
std::uint8_t fp8_e4m3_encode(float x);
// Exact value of a code; NaN for 0x7f and 0xff.
float fp8_e4m3_decode(std::uint8_t code);

// The dynamic scale of a group whose largest magnitude is amax: max(amax, 1e-10) / 448,
// rounded up to a power of two for ScaleFormat::ue8m0.
float fp8_scale(float amax, ScaleFormat format);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace moekit
