#include "core/shared.h"

#include <cstddef>
#include <vector>

#include "core/parallel.h"

namespace moekit::core {
namespace {

// Experts [first, first + count) of a weight tensor [experts, ...] (absent stays absent).
TensorView experts_of(const TensorView& t, std::int64_t first, std::int64_t count) {
  if (!t.defined()) return t;
  std::vector<std::int64_t> shape = t.shape_vector();
  const std::size_t per_expert = t.nbytes() / std::size_t(shape[0]);
  shape[0] = count;
  return TensorView::contiguous(static_cast<std::byte*>(t.data) + per_expert * std::size_t(first), t.dtype, shape,
                                t.device);
}

Weights weights_of(const Weights& w, std::int64_t first, std::int64_t count) {
  Weights part = w;
  part.w13 = experts_of(w.w13, first, count);
  part.w2 = experts_of(w.w2, first, count);
  part.w13_scale = experts_of(w.w13_scale, first, count);
  part.w2_scale = experts_of(w.w2_scale, first, count);
  return part;
}

// A routed id among experts_config's ids; -1 for one outside [0, E).
std::int32_t expert_id_of(std::int64_t id, const MoEConfig& c) {
  if (id < 0 || id >= c.num_experts) return -1;
  return std::int32_t(id + id / c.local_experts() * c.shared_experts);
}

}  // namespace

MoEConfig experts_config(const MoEConfig& c) {
  if (c.shared_experts == 0) return c;
  MoEConfig e = c;
  e.num_experts = std::int64_t(c.ep_size) * c.weight_experts();
  e.routing = RoutingConfig{};
  e.routing.method = RoutingMethod::external;
  e.routing.top_k = int(c.top_k() + c.shared_experts);
  e.shared_experts = 0;
  e.shared_expert_weight = 1.0f;
  return e;
}

std::int64_t weight_owner(const MoEConfig& c, std::int64_t x) {
  return x < c.local_experts() ? c.first_local_expert() + x : c.num_experts + (x - c.local_experts());
}

void append_shared(const MoEConfig& c, std::int64_t tokens, const std::int32_t* ids, const float* weights,
                   std::int32_t* out_ids, float* out_weights) {
  const std::int64_t k = c.top_k(), s = c.shared_experts, width = k + s;
  const std::int64_t first_shared = std::int64_t(c.ep_rank) * c.weight_experts() + c.local_experts();
  parallel_for(tokens, 256, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        out_ids[t * width + j] = expert_id_of(ids[t * k + j], c);
        out_weights[t * width + j] = weights[t * k + j];
      }
      for (std::int64_t j = 0; j < s; ++j) {
        out_ids[t * width + k + j] = std::int32_t(first_shared + j);
        out_weights[t * width + k + j] = c.shared_expert_weight;
      }
    }
  });
}

SharedParts split_shared(const MoEConfig& c, const Weights& w) {
  SharedParts p;
  p.routed = c;
  p.routed.shared_experts = 0;
  p.routed.shared_expert_weight = 1.0f;
  p.routed_weights = weights_of(w, 0, c.local_experts());
  p.shared = p.routed;
  p.shared.num_experts = c.shared_experts;
  p.shared.ep_size = 1;
  p.shared.ep_rank = 0;
  p.shared.routing = RoutingConfig{};
  p.shared.routing.method = RoutingMethod::external;
  p.shared.routing.top_k = int(c.shared_experts);
  p.shared_weights = weights_of(w, c.local_experts(), c.shared_experts);
  p.shared_weights.e_score_correction_bias = {};
  return p;
}

}  // namespace moekit::core
