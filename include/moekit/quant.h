// FP8 e4m3fn codec and the scale rule of DESIGN §4.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/tensor.h"

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

// Quantizes weights w [E, N, K] (f32 | bf16, host) as DESIGN §4 stores them for an FP8 scheme:
// q [E, N, K] fp8 and scales f32, fp8-tensor [E], fp8-rowwise [E, N], fp8-block
// [E, ceil(N/128), ceil(K/128)]; each group's scale is fp8_scale(its amax, format). What the HF
// checkpoints' weight_scale_inv hold for fp8-block. Validates before writing; throws Error.
void quantize_weights(QuantScheme scheme, ScaleFormat format, const TensorView& w, const TensorView& q,
                      const TensorView& scales);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace moekit
