// Activation quantization on the CPU: the four schemes of DESIGN §4 over f32 rows.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rows.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

float amax(const float* x, std::int64_t n);

// q[i] = fp8(x[i] / scale)
void quantize_with_scale(const float* x, std::int64_t n, float scale, std::uint8_t* q);

struct QuantizeParams {
  QuantConfig quant;
  // fp8-tensor only: a static scale; <= 0 means dynamic (amax of the whole input).
  float static_scale = 0.0f;
};

// Quantizes x [M, K] (f32) into out per the scheme. For bf16, rounds to bf16.
void quantize_rows(const QuantizeParams& params, const float* x, std::int64_t rows, std::int64_t cols,
                   const QuantizedRows& out);

// The 256 values of the FP8 codes, for decoding in inner loops.
const float* fp8_decode_table();

}  // namespace moekit::cpu
