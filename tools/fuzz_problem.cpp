#include "fuzz_problem.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/routing.h"

namespace moekit::cli::fuzz {
namespace {

// Streams of a case's seed, one per tensor, so that a tensor does not move when another's
// drawing changes.
enum Stream : std::uint64_t { kHidden = 1, kLogits = 2, kRouting = 3, kScales = 4 };

std::uint64_t seed_of(const Case& c, Stream s) { return mix(c.seed ^ (s * 0xd1342543de82ef95ull)); }

Tensor scalar(float v) {
  Tensor t(DType::f32, {1});
  t.ptr<float>()[0] = v;
  return t;
}

// Real weights times 2^e: the FP8 scales (the codes stay), or the bf16 values themselves.
void scale_weights(core::SyntheticLayer& l, int exponent) {
  if (exponent == 0) return;
  const float factor = std::ldexp(1.0f, exponent);
  if (l.config.quant.scheme == QuantScheme::bf16) {
    for (Tensor* t : {&l.w13, &l.w2})
      for (std::int64_t i = 0; i < t->numel(); ++i) t->ptr<bf16>()[i] = float_to_bf16(bf16_to_float(t->ptr<bf16>()[i]) * factor);
    return;
  }
  for (Tensor* t : {&l.w13_scale, &l.w2_scale})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] *= factor;
}

Tensor make_hidden(const Case& c) {  // the case's T tokens
  const std::int64_t tokens = c.tokens, h = c.config.hidden_size;
  Tensor x = core::make_hidden(tokens, h, seed_of(c, kHidden));
  bf16* v = x.ptr<bf16>();
  if (c.hidden_scale != 1.0)
    for (std::int64_t i = 0; i < x.numel(); ++i) v[i] = float_to_bf16(bf16_to_float(v[i]) * float(c.hidden_scale));
  Draw d(seed_of(c, kHidden));
  if (c.hidden == Hidden::zero_rows)
    for (std::int64_t t = 0; t < tokens; t += 3)
      for (std::int64_t i = 0; i < h; ++i) v[t * h + i] = bf16{0};
  if (c.hidden == Hidden::outliers && x.numel() > 0)
    for (std::int64_t n = 0; n < std::max<std::int64_t>(1, x.numel() / 200); ++n)
      v[d.between(0, x.numel() - 1)] = float_to_bf16(float((d.chance(0.5) ? 1.0 : -1.0) * (1e3 + 9e3 * d.unit())));
  return x;
}

Tensor make_logits(const Case& c) {
  const std::int64_t tokens = c.tokens, e = c.config.num_experts;
  Tensor x = core::make_router_logits(tokens, e, DType::f32, seed_of(c, kLogits));
  float* v = x.ptr<float>();
  Draw d(seed_of(c, kLogits));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  switch (c.logits) {
    case Logits::normal: break;
    case Logits::wide: {
      const float spread = float(5.0 + 45.0 * d.unit());
      for (std::int64_t i = 0; i < x.numel(); ++i) v[i] *= spread;
      break;
    }
    case Logits::ties:
      for (std::int64_t i = 0; i < x.numel(); ++i) v[i] = std::round(v[i] * 4.0f) / 4.0f;
      break;
    case Logits::nonfinite:
      // A quarter of the tokens get 1 to 3 of them (more would leave few tokens of numbers at E = 512).
      for (std::int64_t t = 0; t < tokens; ++t)
        for (std::int64_t n = d.chance(0.25) ? d.between(1, 3) : 0; n > 0; --n) {
          const double u = d.unit();
          v[t * e + d.between(0, e - 1)] = u < 0.4 ? nan : u < 0.6 ? inf : -inf;
        }
      if (tokens > 0) std::fill_n(v, e, nan);           // a token of NaN alone
      if (tokens > 1) std::fill_n(v + e, e, -inf);      // a token of -Inf alone
      if (tokens > 2) v[2 * e] = v[3 * e - 1] = inf;   // two +Inf
      break;
    case Logits::one_expert: {
      const std::int64_t chosen = d.between(0, e - 1);
      for (std::int64_t t = 0; t < tokens; ++t) v[t * e + chosen] += 30.0f;
      break;
    }
  }
  if (c.logits_dtype == DType::f32) return x;
  Tensor b(DType::bf16, {tokens, e});
  for (std::int64_t i = 0; i < x.numel(); ++i) b.ptr<bf16>()[i] = float_to_bf16(v[i]);
  return b;
}

// External routing: the CPU router's (softmax_topk_renorm for the method external), then edited.
void make_routing(const Case& c, const TensorView& bias, Inputs& p) {
  const MoEConfig& m = c.config;
  const std::int64_t tokens = c.tokens, k = m.top_k();
  p.topk_ids = Tensor(DType::i32, {tokens, k});
  p.topk_weights = Tensor(DType::f32, {tokens, k});
  std::int32_t* ids = p.topk_ids.ptr<std::int32_t>();
  float* w = p.topk_weights.ptr<float>();
  Draw d(seed_of(c, kRouting));
  if (c.ids == Ids::random) {
    for (std::int64_t i = 0; i < tokens * k; ++i) {
      ids[i] = std::int32_t(d.between(-1, m.num_experts - 1));
      w[i] = float(d.unit());
    }
    return;
  }
  RoutingConfig r = m.routing;
  if (r.method == RoutingMethod::external) r.method = RoutingMethod::softmax_topk_renorm;
  route(r, {p.logits.view(), r.uses_bias() ? bias : TensorView{}}, {p.topk_ids.view(), p.topk_weights.view()});
  // One expert: half the time one of this rank's (under EP), else any.
  const std::int64_t one = m.ep_size > 1 && d.chance(0.5) ? m.first_local_expert() + d.between(0, m.local_experts() - 1)
                                                          : d.between(0, m.num_experts - 1);
  for (std::int64_t i = 0; i < tokens * k; ++i) {
    // A slot without an expert carries a NaN weight: it must never be read.
    if (c.ids == Ids::some_none && d.chance(1.0 / 3.0)) ids[i] = -1, w[i] = std::numeric_limits<float>::quiet_NaN();
    if (c.ids == Ids::one_expert) ids[i] = std::int32_t(one);
  }
}

// fp8-tensor static scales within 2^±3 of what the data needs (some clip, some leave few levels):
// the hidden states' amax, and the activation's estimated from it (GEMM1 keeps the scale of x
// times that of the weights, 2^weight_exponent; the gated activations square it, swiglu_oai clamps).
void make_static_scales(const Case& c, Problem& p) {
  Draw d(seed_of(c, kScales));
  const double x = 4.0 * c.hidden_scale, hidden_amax = c.hidden == Hidden::outliers ? std::max(x, 1e4) : x;
  const double g = x * std::ldexp(1.0, c.weight_exponent);
  const double act_amax = c.config.activation == Activation::swiglu_oai ? std::min(g, 7.0) * (std::min(g, 7.0) + 1.0) : g * g;
  p.w13_input_scale = scalar(float(hidden_amax / 448.0 * std::ldexp(1.0, int(d.between(-3, 3)))));
  p.w2_input_scale = scalar(float(std::max(act_amax, 1e-30) / 448.0 * std::ldexp(1.0, int(d.between(-3, 3)))));
}

Inputs make_inputs(const Case& c, const TensorView& bias) {
  Inputs in;
  in.hidden = make_hidden(c);
  in.logits = make_logits(c);
  if (!c.fused) make_routing(c, bias, in);
  return in;
}

// Rows of a then rows of b (both [*, n], one dtype); absent stays absent.
Tensor stacked(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return Tensor();
  Tensor t(a.dtype(), {a.size(0) + b.size(0), a.size(1)});
  std::memcpy(t.view().data, a.view().data, a.nbytes());
  std::memcpy(static_cast<std::byte*>(t.view().data) + a.nbytes(), b.view().data, b.nbytes());
  return t;
}

}  // namespace

Weights Problem::weights() const {
  Weights w = layer.weights();
  w.w13_input_scale = w13_input_scale.view();
  w.w2_input_scale = w2_input_scale.view();
  return w;
}

Problem make_problem(const Case& c) {
  Problem p;
  p.layer = core::make_synthetic_layer(c.config, c.seed);
  scale_weights(p.layer, c.weight_exponent);
  if (c.static_scales) make_static_scales(c, p);
  p.in = make_inputs(c, p.layer.e_score_correction_bias.view());
  return p;
}

Inputs larger_batch(const Case& c, const Problem& p) {
  Case more = c;
  more.seed = mix(c.seed ^ 0x6c6172676572ull);
  more.tokens = c.tokens + 5;
  const Inputs extra = make_inputs(more, p.layer.e_score_correction_bias.view());
  return {stacked(p.in.hidden, extra.hidden), stacked(p.in.logits, extra.logits), stacked(p.in.topk_ids, extra.topk_ids),
          stacked(p.in.topk_weights, extra.topk_weights)};
}

void ScaledMaster::row(core::Projection which, std::int64_t local_expert, std::int64_t n, double* out) const {
  master_.row(which, local_expert, n, out);
  const std::int64_t length = which == core::Projection::w13 ? config_.hidden_size : config_.intermediate_size;
  for (std::int64_t i = 0; i < length; ++i) out[i] *= factor_;
}

}  // namespace moekit::cli::fuzz
