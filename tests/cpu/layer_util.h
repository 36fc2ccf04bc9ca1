// Helpers of the Layer tests: a case table row, synthetic layers with their inputs, an
// independent f64 MoE written here (the "ideal" of DESIGN §8 on the dequantized weights),
// and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/synthetic.h"
#include "cpu/reference.h"
#include "moekit/layer.h"
#include "moekit/quant.h"
#include "moekit/routing.h"
#include "test_util.h"

namespace moekit::test {

// Which ids the layer gets: as routed, with some slots set to -1, or every token on one expert.
enum class Ids : std::uint8_t { routed, some_none, one_expert };

struct LayerCase {
  QuantScheme scheme = QuantScheme::bf16;
  Activation activation = Activation::silu_and_mul;
  RoutingMethod method = RoutingMethod::softmax_topk_renorm;
  std::int64_t experts = 6, hidden = 160, inter = 96, tokens = 13;
  int top_k = 2, n_group = 1, topk_group = 1;
  int ep_size = 1, ep_rank = 0;
  ScaleFormat format = ScaleFormat::f32;
  DType logits_dtype = DType::f32;
  Ids ids = Ids::routed;
  bool static_scales = false;  // fp8-tensor: static activation scales
  Fp8Accumulation accumulation = QuantConfig{}.accumulation;  // the CUDA GEMMs' (the CPU sums in f32)
  ExpertsPath path = ExpertsPath::automatic;                  // the CUDA experts' kernels
  std::int64_t shared = 0;                                    // shared experts (MoEConfig::shared_experts)
  float shared_weight = 1.0f;
};

inline std::string underscored(std::string_view s) {
  std::string out(s);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

inline std::string case_name(const LayerCase& c) {
  std::string s = underscored(to_string(c.scheme)) + "_" + std::string(to_string(c.activation)) + "_" +
                  std::string(to_string(c.method)) + "_E" + std::to_string(c.experts) + "_k" +
                  std::to_string(c.top_k) + "_H" + std::to_string(c.hidden) + "_I" + std::to_string(c.inter) +
                  "_T" + std::to_string(c.tokens);
  if (c.n_group > 1) s += "_groups" + std::to_string(c.n_group) + "of" + std::to_string(c.topk_group);
  if (c.ep_size > 1) s += "_ep" + std::to_string(c.ep_rank) + "of" + std::to_string(c.ep_size);
  if (c.format == ScaleFormat::ue8m0) s += "_ue8m0";
  if (c.logits_dtype == DType::bf16) s += "_bf16logits";
  if (c.ids == Ids::some_none) s += "_ids_with_none";
  if (c.ids == Ids::one_expert) s += "_one_expert";
  if (c.static_scales) s += "_static_scales";
  if (c.accumulation != QuantConfig{}.accumulation) s += "_" + std::string(to_string(c.accumulation));
  if (c.path != ExpertsPath::automatic) s += "_" + underscored(to_string(c.path));
  if (c.shared > 0) s += "_shared" + std::to_string(c.shared);
  if (c.shared_weight != 1.0f) s += "_weight" + std::to_string(int(c.shared_weight * 100)) + "pct";
  return s;
}
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << case_name(c); }

inline MoEConfig config_of(const LayerCase& c) {
  MoEConfig m;
  m.num_experts = c.experts;
  m.hidden_size = c.hidden;
  m.intermediate_size = c.inter;
  m.activation = c.activation;
  m.quant = {c.scheme, c.format, c.accumulation};
  m.routing.method = c.method;
  m.routing.top_k = c.top_k;
  m.routing.n_group = c.n_group;
  m.routing.topk_group = c.topk_group;
  if (c.method == RoutingMethod::sigmoid_bias_grouped) m.routing.routed_scaling_factor = 2.5f;
  m.ep_size = c.ep_size;
  m.ep_rank = c.ep_rank;
  m.experts_path = c.path;
  m.shared_experts = c.shared;
  m.shared_expert_weight = c.shared_weight;
  return m;
}

// An ep_size > 1 case is one rank's share alone (no communicator, no exchange).
inline LayerOptions options_of(const LayerCase& c) {
  LayerOptions o;
  if (c.ep_size > 1) o.ep.scope = EpScope::this_rank;
  return o;
}

inline Tensor scalar(float v) {
  Tensor t(DType::f32, {1});
  t.ptr<float>()[0] = v;
  return t;
}

inline Tensor clone(const Tensor& t) {
  if (!t.defined()) return Tensor();
  Tensor c(t.dtype(), t.shape());
  std::memcpy(c.view().data, t.view().data, t.nbytes());
  return c;
}

// Rows [first, first + count) of a 2-D tensor (hidden states, routing), as a tensor of their own.
inline Tensor row_slice(const Tensor& t, std::int64_t first, std::int64_t count) {
  Tensor out(t.dtype(), {count, t.size(1)});
  const std::size_t row = std::size_t(t.size(1)) * dtype_size(t.dtype());
  std::memcpy(out.view().data, static_cast<const std::byte*>(t.view().data) + std::size_t(first) * row,
              std::size_t(count) * row);
  return out;
}

// A synthetic layer (the local experts of config's rank) and, for fp8-tensor with
// static_scales, its static activation scales.
struct TestLayer {
  core::SyntheticLayer synthetic;
  Tensor w13_input_scale, w2_input_scale;

  Weights weights() const {
    Weights w = synthetic.weights();
    w.w13_input_scale = w13_input_scale.view();
    w.w2_input_scale = w2_input_scale.view();
    return w;
  }
};

inline TestLayer make_test_layer(const LayerCase& c, std::uint64_t seed) {
  TestLayer t;
  t.synthetic = core::make_synthetic_layer(config_of(c), seed);
  if (c.static_scales) {
    t.w13_input_scale = scalar(3.5f / 448.0f);
    t.w2_input_scale = scalar(0.5f / 448.0f);
  }
  return t;
}

// The routing a case runs with: ids [T, k] i32 and weights [T, k] f32.
struct Routing {
  Tensor ids, weights;
};

inline Routing route_with(const RoutingConfig& r, const Tensor& logits, const Tensor& bias) {
  const std::int64_t tokens = logits.size(0);
  Routing out{Tensor(DType::i32, {tokens, r.top_k}), Tensor(DType::f32, {tokens, r.top_k})};
  poison(out.ids.view());
  poison(out.weights.view());
  route(r, {logits.view(), bias.view()}, {out.ids.view(), out.weights.view()});
  return out;
}

// Routes per the case (an external case routes with softmax_topk_renorm), then edits ids.
inline Routing case_routing(const LayerCase& c, const Tensor& logits, const Tensor& bias, std::uint64_t seed) {
  RoutingConfig r = config_of(c).routing;
  if (r.method == RoutingMethod::external) r.method = RoutingMethod::softmax_topk_renorm;
  Routing routing = route_with(r, logits, bias);
  std::mt19937_64 rng(seed ^ 0x5151);
  auto* ids = routing.ids.ptr<std::int32_t>();
  for (std::int64_t i = 0; i < routing.ids.numel(); ++i) {
    // A slot without an expert carries a NaN weight: it must never be read.
    if (c.ids == Ids::some_none && rng() % 3 == 0) ids[i] = -1, routing.weights.ptr<float>()[i] = NAN;
    if (c.ids == Ids::one_expert) ids[i] = std::int32_t(c.experts - 2);
  }
  return routing;
}

// Hidden, logits and the case's routing, all from one seed.
struct Inputs {
  Tensor hidden, logits;
  Routing routing;
};

inline Inputs make_inputs(const LayerCase& c, const TestLayer& layer, std::uint64_t seed) {
  Inputs in;
  in.hidden = core::make_hidden(c.tokens, c.hidden, seed + 1);
  in.logits = core::make_router_logits(c.tokens, c.experts, c.logits_dtype, seed + 2);
  in.routing = case_routing(c, in.logits, layer.synthetic.e_score_correction_bias, seed);
  return in;
}

inline Tensor poisoned_out(std::int64_t tokens, std::int64_t hidden) {
  Tensor out(DType::bf16, {tokens, hidden});
  poison(out.view());
  return out;
}

inline Routing row_slice(const Routing& r, std::int64_t first, std::int64_t count) {
  return {row_slice(r.ids, first, count), row_slice(r.weights, first, count)};
}

inline Tensor run_external(Layer& layer, const Tensor& hidden, const Routing& r) {
  Tensor out = poisoned_out(hidden.size(0), hidden.size(1));
  layer.forward(ExternalArgs{hidden.view(), r.ids.view(), r.weights.view(), out.view()});
  return out;
}

inline Tensor run_pipeline_reference(const MoEConfig& config, const Weights& w, const Tensor& hidden,
                                     const Routing& r) {
  Tensor out = poisoned_out(hidden.size(0), hidden.size(1));
  cpu::pipeline_reference({config, w, hidden.view(), r.ids.view(), r.weights.view()}, out.view());
  return out;
}

// How many elements differ in their bits (NaN poison left behind counts as a difference).
inline std::int64_t bit_differences(const Tensor& a, const Tensor& b, std::int64_t* first = nullptr) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.numel(), b.numel());
  const std::size_t size = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.view().data);
  const auto* pb = static_cast<const unsigned char*>(b.view().data);
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    if (std::memcmp(pa + std::size_t(i) * size, pb + std::size_t(i) * size, size) != 0 && n++ == 0 && first) *first = i;
  return n;
}

// ‖out − ref‖ / ‖ref‖; NaN anywhere in out gives +inf.
inline double relative_error(const Tensor& out, const std::vector<double>& ref) {
  double err2 = 0.0, ref2 = 0.0;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double v = bf16_to_float(out.ptr<bf16>()[i]);
    if (std::isnan(v)) return INFINITY;
    err2 += (v - ref[std::size_t(i)]) * (v - ref[std::size_t(i)]);
    ref2 += ref[std::size_t(i)] * ref[std::size_t(i)];
  }
  return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
}

// ---- The f64 MoE: route given, weights dequantized, no activation quantization. ----

// Real value of element (e, n, k) of a weight tensor [E_local, N, K] with its scales.
inline double dequantized(const MoEConfig& c, const TensorView& w, const TensorView& s, std::int64_t e,
                          std::int64_t n, std::int64_t k) {
  const std::int64_t rows = w.size(1), cols = w.size(2);
  const std::int64_t i = (e * rows + n) * cols + k;
  if (c.quant.scheme == QuantScheme::bf16) return bf16_to_float(w.ptr<bf16>()[i]);
  const double q = fp8_e4m3_decode(w.ptr<std::uint8_t>()[i]);
  const float* scale = s.ptr<float>();
  switch (c.quant.scheme) {
    case QuantScheme::fp8_tensor: return q * scale[e];
    case QuantScheme::fp8_rowwise: return q * scale[e * rows + n];
    default: {
      const std::int64_t nb = (rows + 127) / 128, kb = (cols + 127) / 128;
      return q * scale[(e * nb + n / 128) * kb + k / 128];
    }
  }
}

inline double activation_f64(const MoEConfig& c, double gate, double up) {
  switch (c.activation) {
    case Activation::silu_and_mul: return gate / (1.0 + std::exp(-gate)) * up;
    case Activation::gelu_and_mul: return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case Activation::swiglu_oai: {
      const double g = std::min(gate, double(c.swiglu_limit));
      const double u = std::clamp(up, -double(c.swiglu_limit), double(c.swiglu_limit));
      return g / (1.0 + std::exp(-double(c.swiglu_alpha) * g)) * (u + 1.0);
    }
    case Activation::relu2: return gate > 0 ? gate * gate : 0.0;
  }
  return NAN;
}

// out [T * H]: for each token and slot whose expert is local, the expert's MLP in f64, weighted.
inline std::vector<double> f64_layer(const MoEConfig& c, const Weights& w, const Tensor& hidden,
                                     const Routing& r) {
  const std::int64_t tokens = hidden.size(0), h = c.hidden_size, inter = c.intermediate_size;
  const std::int64_t width = c.gemm1_width(), k = c.top_k();
  const bool on_input = c.routing.effective_placement() == WeightPlacement::input;
  std::vector<double> out(std::size_t(tokens * h), 0.0);
  std::vector<double> x(static_cast<std::size_t>(h)), g(static_cast<std::size_t>(width)),
      act(static_cast<std::size_t>(inter));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = r.ids.ptr<std::int32_t>()[t * k + j] - c.first_local_expert();
      if (r.ids.ptr<std::int32_t>()[t * k + j] < 0 || e < 0 || e >= c.local_experts()) continue;
      const double weight = r.weights.ptr<float>()[t * k + j];
      for (std::int64_t i = 0; i < h; ++i)
        x[std::size_t(i)] = bf16_to_float(hidden.ptr<bf16>()[t * h + i]) * (on_input ? weight : 1.0);
      for (std::int64_t n = 0; n < width; ++n) {
        double s = 0.0;
        for (std::int64_t i = 0; i < h; ++i) s += x[std::size_t(i)] * dequantized(c, w.w13, w.w13_scale, e, n, i);
        g[std::size_t(n)] = s;
      }
      for (std::int64_t i = 0; i < inter; ++i)
        act[std::size_t(i)] = activation_f64(c, g[std::size_t(i)], c.gated() ? g[std::size_t(inter + i)] : 0.0);
      for (std::int64_t n = 0; n < h; ++n) {
        double s = 0.0;
        for (std::int64_t i = 0; i < inter; ++i) s += act[std::size_t(i)] * dequantized(c, w.w2, w.w2_scale, e, n, i);
        out[std::size_t(t * h + n)] += (on_input ? 1.0 : weight) * s;
      }
    }
  }
  return out;
}

}  // namespace moekit::test
