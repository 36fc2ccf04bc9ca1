// The two references of DESIGN §8, token by token, independent of the stage pipeline's
// permutation and finalize:
// - pipeline: the same quantization points and rounding as the device pipeline
//   (GEMM outputs rounded to bf16, activations requantized); checks a backend.
// - ideal: f64 throughout, real-valued weights, no activation quantization; measures what
//   quantization costs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/master_weights.h"
#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

// Shared experts (MoEConfig::shared_experts) are part of the math: every token's slots k..k+S-1,
// the last S experts of the weights, with shared_expert_weight.
struct ReferenceInputs {
  MoEConfig config;
  Weights weights;          // local experts (then the shared ones), as given to the Layer
  TensorView hidden;        // [T, H] bf16
  TensorView topk_ids;      // [T, k] i32, the routing (without the shared experts)
  TensorView topk_weights;  // [T, k] f32
  // The sensitivity of the pipeline reference (the check's CheckSampling): each GEMM1 output
  // moves one bf16 step up or down with this probability (0: never), drawn from `flip_seed`, as a
  // device's GEMM1 sums, a few last bits away from the CPU's, round some outputs to the other
  // bf16 neighbour; everything after follows (requantization, dynamic scales).
  // With `gemm1_scale_steps`, also the GEMM1 outputs behind the largest activation under each
  // dynamic scale (each 128 of a row for fp8-block, the row otherwise: the tensor's largest is a
  // row's) move a step, up or down by the seed: what moves a scale, and every code under it.
  double gemm1_flips = 0.0;
  bool gemm1_scale_steps = false;
  std::uint64_t flip_seed = 0;
  // Whether the rows include the shared experts' for every token. Under EP every rank holds them:
  // one rank computes them for the whole batch.
  bool shared_rows = true;
};

// out [T, H] bf16; rows of tokens with no local expert are zero.
void pipeline_reference(const ReferenceInputs& in, const TensorView& out);

// The pipeline reference's expert outputs before the weighted sum: one bf16 row per (token,
// slot) whose expert is local, in (token, slot) order (slots k..k+S-1: the shared experts). Under EP each rank computes its
// experts' rows for the whole batch; reduce_amax then turns this rank's fp8-tensor dynamic
// amax of the activations into the group's (as ep = 1 takes it over every expert's rows).
struct ExpertRows {
  std::vector<std::int64_t> token;  // [P]
  std::vector<std::int32_t> slot;   // [P]
  std::vector<bf16> values;         // [P, H]
};
ExpertRows pipeline_reference_rows(const ReferenceInputs& in, const std::function<float(float)>& reduce_amax = {});

// Every slot's weight, [T, k + S]: the routing's, then shared_expert_weight.
std::vector<float> slot_weights(const ReferenceInputs& in);

// out[t] = bf16(sum over slots j ascending of w[t, j] * row(t, j)), f32 sums, as the ep = 1
// finalize adds them; rows[t * k + j] null for a slot with no row. weights null when they
// went on the input. (With shared experts k counts them: k + S slots.)
void sum_slots(const bf16* const* rows, const float* weights, std::int64_t tokens, int top_k, std::int64_t hidden,
               bf16* out);

// Returns [T * H] in f64.
std::vector<double> ideal_reference(const ReferenceInputs& in, const core::MasterWeights& master);

}  // namespace moekit::cpu
