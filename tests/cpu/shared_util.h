// The reference of a shared-expert layer written from its definition, independent of the layer's
// fusion (core/shared.h's id map, the Shared stage): the routed layer and the shared experts run
// alone as two plain layers (core::split_shared; the library's pipeline reference for each, as if
// each were the layer), and every token's rows summed in slot order, the routed slots then the
// shared ones, in f32 as the finalize does (cpu::sum_slots).
#pragma once

#include <vector>

#include "core/shared.h"
#include "cpu/layer_util.h"

namespace moekit::test {

// The routing of the shared experts alone: every token to each of them, with shared_expert_weight.
inline Routing shared_routing(const MoEConfig& c, std::int64_t tokens) {
  const std::int64_t s = c.shared_experts;
  Routing r{Tensor(DType::i32, {tokens, s}), Tensor(DType::f32, {tokens, s})};
  for (std::int64_t i = 0; i < tokens * s; ++i) {
    r.ids.ptr<std::int32_t>()[i] = std::int32_t(i % s);
    r.weights.ptr<float>()[i] = c.shared_expert_weight;
  }
  return r;
}

// out [T, H]: bf16(sum of the routed rows (weighted by r) and the shared rows), f32 sums.
inline Tensor apart_reference(const MoEConfig& c, const Weights& w, const Tensor& hidden, const Routing& r) {
  const core::SharedParts parts = core::split_shared(c, w);
  const std::int64_t tokens = hidden.size(0), h = c.hidden_size, k = c.top_k(), width = k + c.shared_experts;
  const Routing alone = shared_routing(c, tokens);
  const cpu::ExpertRows routed =
      cpu::pipeline_reference_rows({parts.routed, parts.routed_weights, hidden.view(), r.ids.view(), r.weights.view()});
  const cpu::ExpertRows shared = cpu::pipeline_reference_rows(
      {parts.shared, parts.shared_weights, hidden.view(), alone.ids.view(), alone.weights.view()});
  std::vector<const bf16*> rows(std::size_t(tokens * width), nullptr);
  for (std::size_t p = 0; p < routed.token.size(); ++p)
    rows[std::size_t(routed.token[p] * width + routed.slot[p])] = routed.values.data() + std::int64_t(p) * h;
  for (std::size_t p = 0; p < shared.token.size(); ++p)
    rows[std::size_t(shared.token[p] * width + k + shared.slot[p])] = shared.values.data() + std::int64_t(p) * h;
  std::vector<float> weights(std::size_t(tokens * width));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t j = 0; j < width; ++j)
      weights[std::size_t(t * width + j)] = j < k ? r.weights.ptr<float>()[t * k + j] : c.shared_expert_weight;
  Tensor out = poisoned_out(tokens, h);
  cpu::sum_slots(rows.data(), weights.data(), tokens, int(width), h, out.ptr<bf16>());
  return out;
}

}  // namespace moekit::test
