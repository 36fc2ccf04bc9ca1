// The GEMMs of the experts on the CPU: one A row against one expert's [N, K] weights,
// f32 accumulation, scales applied per the quant scheme, bf16 out.
//
// Order of the arithmetic (the contract the pipeline reference shares):
//   for each 128-wide K chunk kb: p = sum_{k in kb, ascending} a_q[k] * w_q[n, k]   (f32)
//     fp8-block: acc += (a_s[kb] * w_s[n/128, kb]) * p        others: acc += p
//   fp8-tensor: acc * a_s * w_s[e]    fp8-rowwise: acc * a_s[m] * w_s[e, n]    then bf16.
#pragma once

#include <cstdint>

#include "cpu/quant.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

// One expert's matrix: values [N, K] (bf16 or fp8) and its scales.
//   fp8-tensor [1]   fp8-rowwise [N]   fp8-block [ceil(N/128), ceil(K/128)]   bf16 none
struct ExpertMatrix {
  const void* values = nullptr;
  const float* scales = nullptr;
  std::int64_t n = 0;
  std::int64_t k = 0;
};

// Expert e of a weights tensor [E_local, N, K] with its scales tensor.
ExpertMatrix expert_matrix(const TensorView& weights, const TensorView& scales, QuantScheme scheme,
                           std::int64_t expert);

// One row of activations: values [K] and the row's scales (tensor: [1], rowwise: [1],
// block: [ceil(K/128)]).
struct ActivationRow {
  const void* values = nullptr;
  const float* scales = nullptr;
};

ActivationRow activation_row(const QuantizedRows& rows, QuantScheme scheme, std::int64_t row);

// out[n0:n1] of the row times the expert's matrix.
void gemm_row(QuantScheme scheme, const ActivationRow& a, const ExpertMatrix& w, std::int64_t n0,
              std::int64_t n1, bf16* out);

// The contiguous grouped GEMM: rows [offsets[e], offsets[e+1]) of a belong to expert e.
struct GroupedGemmArgs {
  QuantScheme scheme = QuantScheme::bf16;
  QuantizedRows a;                     // [M, K]
  const std::int64_t* offsets = nullptr;  // [E_local + 1]
  TensorView weights;                  // [E_local, N, K]
  TensorView weight_scales;
  bf16* out = nullptr;                 // [M, N]
};

void grouped_gemm(const GroupedGemmArgs& args);

}  // namespace moekit::cpu
