// Activations ready for a GEMM: values and their scales, as stages hand them on.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit {

//   bf16        q [M, K] bf16, scales absent
//   fp8-tensor  q [M, K] fp8,  scales [1]
//   fp8-rowwise q [M, K] fp8,  scales [M]
//   fp8-block   q [M, K] fp8,  scales [M, ceil(K/128)]
struct QuantizedRows {
  TensorView q;
  TensorView scales;
};

// Shape of the scales of M rows of K values; empty for bf16.
std::vector<std::int64_t> scale_shape(QuantScheme scheme, std::int64_t rows, std::int64_t cols);

inline DType activation_dtype(QuantScheme scheme) {
  return scheme == QuantScheme::bf16 ? DType::bf16 : DType::fp8_e4m3;
}

}  // namespace moekit
