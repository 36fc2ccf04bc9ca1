// Helpers shared by the routing tests: tensors from values, and route() with poisoned outputs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moekit/routing.h"
#include "test_util.h"

namespace moekit::test {

// A contiguous tensor holding `values` in `dtype` (f32, or bf16 rounded to nearest even).
inline Tensor make_tensor(DType dtype, std::vector<std::int64_t> shape, const std::vector<float>& values) {
  Tensor t(dtype, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::bf16) t.ptr<bf16>()[i] = float_to_bf16(values[i]);
    else t.ptr<float>()[i] = values[i];
  }
  return t;
}

inline RoutingConfig routing_config(RoutingMethod method, int top_k, int n_group = 1, int topk_group = 1,
                                    float routed_scaling_factor = 1.0f) {
  RoutingConfig c;
  c.method = method;
  c.top_k = top_k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = routed_scaling_factor;
  return c;
}

struct Routed {
  std::vector<std::int32_t> ids;  // [T, k]
  std::vector<float> weights;     // [T, k]
};

// Routes logits [T, E] through moekit::route. The outputs are poisoned first, so a slot the
// router forgets to write shows up as -1 / NaN.
inline Routed route_logits(const RoutingConfig& config, const Tensor& logits, const Tensor* bias = nullptr) {
  const std::int64_t num_tokens = logits.size(0);
  Tensor ids(DType::i32, {num_tokens, config.top_k});
  Tensor weights(DType::f32, {num_tokens, config.top_k});
  poison(ids.view());
  poison(weights.view());
  RoutingInputs in{logits.view(), bias ? bias->view() : TensorView{}};
  route(config, in, RoutingOutputs{ids.view(), weights.view()});
  Routed r;
  r.ids.assign(ids.ptr<std::int32_t>(), ids.ptr<std::int32_t>() + ids.numel());
  r.weights.assign(weights.ptr<float>(), weights.ptr<float>() + weights.numel());
  return r;
}

// Every method route() computes (all but external).
inline std::vector<RoutingMethod> routable_methods() {
  return {RoutingMethod::softmax_topk,         RoutingMethod::topk_softmax,
          RoutingMethod::softmax_topk_renorm,  RoutingMethod::sigmoid_topk,
          RoutingMethod::sigmoid_topk_renorm,  RoutingMethod::sigmoid_bias_grouped,
          RoutingMethod::sigmoid_bias_renorm,  RoutingMethod::top1_sigmoid};
}

}  // namespace moekit::test
