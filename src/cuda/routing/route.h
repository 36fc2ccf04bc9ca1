// Routing on the GPU (DESIGN §3): router logits [T, E] -> topk ids and weights [T, k], every
// method, f32 or bf16 logits, f32 or bf16 bias. Matches src/cpu/routing.cpp: the same
// selection (higher first, NaN below every number, ties to the lower index) and the same
// arithmetic order; exponentials are evaluated in double and rounded once, so a score differs
// from the CPU's only where glibc's expf is not correctly rounded (about 1 argument in 13,000),
// by an ulp; through a renormalizing sum and the scaling factor a weight can then move by up
// to 4 ulp (tests/cuda/routing_test.cpp; 99.98% of weights are bit-identical).
//
// Paths: E <= 512 keeps each lane's E/32 scores in registers (one warp per token); larger E
// (up to kMaxExperts) keeps them in shared memory. Any k <= E works on both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/stages.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cuda::routing {

inline constexpr std::int64_t kMaxRegisterExperts = 512;
inline constexpr std::int64_t kMaxExperts = 8192;

struct Problem {
  RoutingConfig config;
  std::int64_t tokens = 0;   // T (may be 0)
  std::int64_t experts = 0;  // E
  DType logits_dtype = DType::f32;  // f32 | bf16
  DType bias_dtype = DType::f32;    // f32 | bf16; read only by the *_bias_* methods
  std::string to_string() const;
};

struct Args {
  const void* logits = nullptr;  // [T, E] logits_dtype
  const void* bias = nullptr;    // [E] bias_dtype; the *_bias_* methods only
  std::int32_t* topk_ids = nullptr;  // [T, k]
  float* topk_weights = nullptr;     // [T, k]
};

Status can_implement(const Problem& problem);
std::size_t workspace_size(const Problem& problem);
// Asynchronous on `stream`; no allocation, no host synchronization (graph-capturable).
// Throws Error when can_implement says no.
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream);

}  // namespace moekit::cuda::routing
