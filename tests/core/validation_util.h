// Helpers of the validation tests: a valid layer with valid arguments that each case then
// breaks in one place, and the message of the Error that follows.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/synthetic.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "test_util.h"

namespace moekit::test {

// Everything a valid call needs. Cases edit config, weights or args, then call.
struct Scene {
  MoEConfig config;
  core::SyntheticLayer layer;
  Weights weights;
  Tensor hidden, logits, ids, topk_weights;  // inputs; ids/topk_weights from moekit::route
  Tensor out, out_ids, out_weights;          // outputs, poisoned
  FusedArgs fused;
  ExternalArgs external;
  std::vector<Tensor> keep;  // storage for the tensors a case substitutes

  // A new host tensor kept alive with the setup, its bytes poisoned.
  TensorView make(DType dtype, const std::vector<std::int64_t>& shape) {
    keep.emplace_back(dtype, shape);
    poison(keep.back().view());
    return keep.back().view();
  }
};

inline MoEConfig base_config(QuantScheme scheme) {
  MoEConfig c;
  c.num_experts = 6;
  c.hidden_size = scheme == QuantScheme::fp8_block ? 144 : 160;
  c.intermediate_size = scheme == QuantScheme::fp8_block ? 128 : 96;
  c.quant.scheme = scheme;
  c.routing.method = RoutingMethod::softmax_topk_renorm;
  c.routing.top_k = 2;
  return c;
}

inline Scene make_scene(QuantScheme scheme, std::uint64_t seed, std::int64_t tokens = 5) {
  Scene s;
  s.config = base_config(scheme);
  s.layer = core::make_synthetic_layer(s.config, seed);
  s.weights = s.layer.weights();
  const std::int64_t e = s.config.num_experts, h = s.config.hidden_size, k = s.config.top_k();
  s.hidden = core::make_hidden(tokens, h, seed + 1);
  s.logits = core::make_router_logits(tokens, e, DType::f32, seed + 2);
  s.ids = Tensor(DType::i32, {tokens, k});
  s.topk_weights = Tensor(DType::f32, {tokens, k});
  route(s.config.routing, {s.logits.view(), {}}, {s.ids.view(), s.topk_weights.view()});
  s.out = Tensor(DType::bf16, {tokens, h});
  s.out_ids = Tensor(DType::i32, {tokens, k});
  s.out_weights = Tensor(DType::f32, {tokens, k});
  for (const Tensor* t : {&s.out, &s.out_ids, &s.out_weights}) poison(t->view());
  s.fused = {s.hidden.view(), s.logits.view(), s.out.view(), s.out_ids.view(), s.out_weights.view()};
  s.external = {s.hidden.view(), s.ids.view(), s.topk_weights.view(), s.out.view()};
  return s;
}

// The message of the moekit::Error that f throws; "<no error>" or "<other exception: ...>" else.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other exception: ") + e.what() + ">";
  }
  return "<no error>";
}

inline void expect_mentions(const std::string& message, const std::vector<std::string>& words) {
  for (const std::string& w : words) EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
}

// A copy of a tensor's bytes, to show later that nothing was written.
inline std::vector<unsigned char> bytes_of(const TensorView& t) {
  if (!t.defined() || t.data == nullptr) return {};
  const auto* p = static_cast<const unsigned char*>(t.data);
  return std::vector<unsigned char>(p, p + t.nbytes());
}

// A view whose rows are `pad` elements apart: the right shape, not contiguous.
inline TensorView padded_rows(Scene& s, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t pad) {
  TensorView v = s.make(dtype, {rows, cols + pad});
  v.shape[1] = cols;
  return v;
}

}  // namespace moekit::test
