// `moekit fuzz`: the host tensors of a drawn case (fuzz_case.h), all made from its seed.
#pragma once

#include <cmath>

#include "core/master_weights.h"
#include "core/synthetic.h"
#include "fuzz_case.h"
#include "moekit/layer.h"

namespace moekit::cli::fuzz {

// What one call of the layer takes.
struct Inputs {
  Tensor hidden;                  // [T, H] bf16
  Tensor logits;                  // [T, E] f32 | bf16 (the case's dtype)
  Tensor topk_ids, topk_weights;  // external routing: [T, k] i32, f32
};

struct Problem {
  core::SyntheticLayer layer;               // the config's local experts, times 2^weight_exponent
  Tensor w13_input_scale, w2_input_scale;   // fp8-tensor static scales, [1] each
  Inputs in;                                // the case's T tokens

  Weights weights() const;
};

Problem make_problem(const Case& c);

// A batch of 2T + 5 tokens whose first T are the problem's (the rest drawn alike): the call a
// case with larger_call_first makes before its own, so that a layer reused at a smaller T shows
// what its buffers kept, and a batch-invariant layer that its tokens' bits changed.
Inputs larger_batch(const Case& c, const Problem& p);

// The real weights of a problem for the ideal reference: the synthetic master rows times
// 2^weight_exponent (exact: a power of two moves the exponent only).
class ScaledMaster final : public core::MasterWeights {
 public:
  explicit ScaledMaster(const Case& c)
      : config_(c.config), master_(c.config, c.seed), factor_(std::ldexp(1.0, c.weight_exponent)) {}
  void row(core::Projection which, std::int64_t local_expert, std::int64_t n, double* out) const override;

 private:
  MoEConfig config_;
  core::SyntheticMaster master_;
  double factor_;
};

}  // namespace moekit::cli::fuzz
