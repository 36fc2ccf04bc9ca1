#include "cpu/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/parallel.h"
#include "core/rows.h"
#include "cpu/activation.h"
#include "cpu/gemm.h"
#include "cpu/quant.h"
#include "moekit/quant.h"

namespace moekit::cpu {
namespace {

// The (token, slot) pairs whose expert is local, in (token, slot) order.
struct Pair {
  std::int64_t token;
  int slot;
  std::int64_t expert;  // local index
};

// Shared experts (MoEConfig::shared_experts) are slots k..k+S-1 of every token, local experts
// E_local..E_local+S-1 (the weights' layout), when in.shared_rows.
std::vector<Pair> local_pairs(const ReferenceInputs& in) {
  std::vector<Pair> pairs;
  const std::int64_t tokens = in.hidden.size(0), el = in.config.local_experts();
  const int k = in.config.top_k(), shared = in.shared_rows ? int(in.config.shared_experts) : 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const std::int64_t e = std::int64_t(in.topk_ids.ptr<std::int32_t>()[t * k + j]) -
                             in.config.first_local_expert();
      if (e >= 0 && e < el) pairs.push_back({t, j, e});
    }
    for (int s = 0; s < shared; ++s) pairs.push_back({t, k + s, el + s});
  }
  return pairs;
}

// The routing weight of a pair's slot: the caller's, or shared_expert_weight.
float slot_weight(const ReferenceInputs& in, std::int64_t token, int slot) {
  const int k = in.config.top_k();
  return slot < k ? in.topk_weights.ptr<float>()[token * k + slot] : in.config.shared_expert_weight;
}

bool weights_on_input(const MoEConfig& c) { return c.routing.effective_placement() == WeightPlacement::input; }

float input_value(const ReferenceInputs& in, std::int64_t t, std::int64_t i) {
  const float v = bf16_to_float(in.hidden.ptr<bf16>()[t * in.config.hidden_size + i]);
  return weights_on_input(in.config) ? round_to_bf16(v * in.topk_weights.ptr<float>()[t]) : v;
}

QuantizedRows rows_buffer(QuantScheme scheme, std::int64_t rows, std::int64_t cols, Tensor& q, Tensor& s) {
  q = Tensor(activation_dtype(scheme), {rows, cols});
  if (scheme != QuantScheme::bf16) s = Tensor(DType::f32, scale_shape(scheme, rows, cols));
  return {q.view(), s.view()};
}

double silu64(double x) { return x / (1.0 + std::exp(-x)); }

double activation64(const MoEConfig& c, double gate, double up) {
  switch (c.activation) {
    case Activation::silu_and_mul: return silu64(gate) * up;
    case Activation::gelu_and_mul: return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case Activation::swiglu_oai: {
      const double g = std::fmin(gate, c.swiglu_limit);
      const double u = std::fmax(std::fmin(up, c.swiglu_limit), -double(c.swiglu_limit));
      return g / (1.0 + std::exp(-c.swiglu_alpha * g)) * (u + 1.0);
    }
    case Activation::relu2: {
      const double r = std::fmax(gate, 0.0);
      return r * r;
    }
  }
  return 0.0;
}

// Moves v one bf16 step away from zero (up) or towards it; zero and non-finite values stay.
bf16 bf16_step(bf16 v, bool up) {
  const float f = bf16_to_float(v);
  if (f == 0.0f || !std::isfinite(f)) return v;
  const std::uint16_t bits = std::bit_cast<std::uint16_t>(v);
  const std::uint16_t moved = up ? std::uint16_t(bits + 1) : std::uint16_t(bits - 1);
  return std::isfinite(bf16_to_float(std::bit_cast<bf16>(moved))) ? std::bit_cast<bf16>(moved) : v;
}

// splitmix64 of (seed, pair, column): one draw per GEMM1 output, the same on every platform.
std::uint64_t flip_draw(std::uint64_t seed, std::int64_t pair, std::int64_t column) {
  std::uint64_t z = seed ^ (std::uint64_t(pair) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(column) * 0xBF58476D1CE4E5B9ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void flip_outputs(const ReferenceInputs& in, std::int64_t pair, bf16* g, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t d = flip_draw(in.flip_seed, pair, i);
    if (double(d >> 11) * 0x1p-53 < in.gemm1_flips) g[i] = bf16_step(g[i], (d & 1) != 0);  // the top 53 bits: U[0, 1)
  }
}

// The GEMM1 outputs (gate and up) of the largest activation of each group moved a step, the
// direction drawn per group; the activations computed again.
void step_largest(const ReferenceInputs& in, const ActivationParams& params, std::int64_t pair, bf16* g, float* act) {
  const MoEConfig& c = in.config;
  const std::int64_t inter = c.intermediate_size;
  const std::int64_t group = c.quant.scheme == QuantScheme::fp8_block ? std::min<std::int64_t>(128, inter) : inter;
  for (std::int64_t b = 0; b < inter; b += group) {
    std::int64_t j = b;
    for (std::int64_t i = b; i < std::min(b + group, inter); ++i)
      if (std::fabs(act[i]) > std::fabs(act[j])) j = i;
    const bool up = (flip_draw(in.flip_seed, pair, inter + j) & 1) != 0;
    g[j] = bf16_step(g[j], up);
    if (c.gated()) g[inter + j] = bf16_step(g[inter + j], up);
  }
  activate_row(params, g, act);
}

}  // namespace

ExpertRows pipeline_reference_rows(const ReferenceInputs& in, const std::function<float(float)>& reduce_amax) {
  const MoEConfig& c = in.config;
  const QuantScheme scheme = c.quant.scheme;
  const std::int64_t tokens = in.hidden.size(0), h = c.hidden_size, inter = c.intermediate_size;
  const float a1_static = in.weights.w13_input_scale.defined() ? in.weights.w13_input_scale.ptr<float>()[0] : 0.0f;
  float a2_static = in.weights.w2_input_scale.defined() ? in.weights.w2_input_scale.ptr<float>()[0] : 0.0f;

  // 1. The input rows, quantized per token (per tensor for fp8-tensor).
  std::vector<float> x(std::size_t(tokens * h));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t i = 0; i < h; ++i) x[std::size_t(t * h + i)] = input_value(in, t, i);
  Tensor a1q, a1s;
  const QuantizedRows a1 = rows_buffer(scheme, tokens, h, a1q, a1s);
  quantize_rows({c.quant, a1_static}, x.data(), tokens, h, a1);

  // 2. GEMM1 and the activation for every local (token, slot).
  const std::vector<Pair> pairs = local_pairs(in);
  const std::int64_t n_pairs = std::int64_t(pairs.size());
  std::vector<float> act(std::size_t(n_pairs * inter));
  const ActivationParams act_params = ActivationParams::of(c);
  core::parallel_for(n_pairs, 1, [&](std::int64_t b, std::int64_t e) {
    std::vector<bf16> g(std::size_t(c.gemm1_width()));
    for (std::int64_t p = b; p < e; ++p) {
      const Pair& pr = pairs[std::size_t(p)];
      const ExpertMatrix w = expert_matrix(in.weights.w13, in.weights.w13_scale, scheme, pr.expert);
      gemm_row(scheme, activation_row(a1, scheme, pr.token), w, 0, w.n, g.data());
      if (in.gemm1_flips > 0.0) flip_outputs(in, p, g.data(), w.n);
      activate_row(act_params, g.data(), act.data() + p * inter);
      if (in.gemm1_scale_steps && scheme != QuantScheme::bf16) step_largest(in, act_params, p, g.data(), act.data() + p * inter);
    }
  });

  // 3. Requantize (over the group's amax under EP) and GEMM2.
  if (scheme == QuantScheme::fp8_tensor && a2_static <= 0.0f && reduce_amax)
    a2_static = fp8_scale(reduce_amax(amax(act.data(), n_pairs * inter)), c.quant.scale_format);
  Tensor a2q, a2s;
  const QuantizedRows a2 = rows_buffer(scheme, n_pairs, inter, a2q, a2s);
  quantize_rows({c.quant, a2_static}, act.data(), n_pairs, inter, a2);
  ExpertRows rows;
  rows.values.resize(std::size_t(n_pairs * h));
  core::parallel_for(n_pairs, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t p = b; p < e; ++p) {
      const ExpertMatrix w = expert_matrix(in.weights.w2, in.weights.w2_scale, scheme, pairs[std::size_t(p)].expert);
      gemm_row(scheme, activation_row(a2, scheme, p), w, 0, w.n, rows.values.data() + p * h);
    }
  });
  for (const Pair& pr : pairs) {
    rows.token.push_back(pr.token);
    rows.slot.push_back(pr.slot);
  }
  return rows;
}

std::vector<float> slot_weights(const ReferenceInputs& in) {
  const std::int64_t tokens = in.hidden.size(0);
  const int k = int(in.config.top_k() + in.config.shared_experts);
  std::vector<float> w(std::size_t(tokens * k));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j) w[std::size_t(t * k + j)] = slot_weight(in, t, j);
  return w;
}

void sum_slots(const bf16* const* rows, const float* weights, std::int64_t tokens, int k, std::int64_t h, bf16* out) {
  core::parallel_for(tokens, 4, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t)
      for (std::int64_t i = 0; i < h; ++i) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) {
          const bf16* row = rows[t * k + j];
          if (row) sum += (weights ? weights[t * k + j] : 1.0f) * bf16_to_float(row[i]);
        }
        out[t * h + i] = float_to_bf16(sum);
      }
  });
}

void pipeline_reference(const ReferenceInputs& in, const TensorView& out) {
  const MoEConfig& c = in.config;
  const std::int64_t tokens = in.hidden.size(0), h = c.hidden_size;
  const int k = int(c.top_k() + c.shared_experts);
  const ExpertRows rows = pipeline_reference_rows(in);
  std::vector<const bf16*> slots(std::size_t(tokens * k), nullptr);
  for (std::size_t p = 0; p < rows.token.size(); ++p)
    slots[std::size_t(rows.token[p] * k + rows.slot[p])] = rows.values.data() + std::int64_t(p) * h;
  const std::vector<float> weights = slot_weights(in);
  sum_slots(slots.data(), weights_on_input(c) ? nullptr : weights.data(), tokens, k, h, out.ptr<bf16>());
}

std::vector<double> ideal_reference(const ReferenceInputs& in, const core::MasterWeights& master) {
  const MoEConfig& c = in.config;
  const std::int64_t tokens = in.hidden.size(0), h = c.hidden_size, inter = c.intermediate_size;
  const std::int64_t width = c.gemm1_width();
  const std::vector<Pair> pairs = local_pairs(in);
  const std::int64_t n_pairs = std::int64_t(pairs.size());
  // Making a master row costs far more than a dot product with it: each row is made once and
  // applied to every pair of its expert. Tasks: (expert with pairs, kRowsPerTask rows).
  constexpr std::int64_t kRowsPerTask = 16;
  std::vector<std::vector<std::int64_t>> of_expert(std::size_t(c.weight_experts()));
  for (std::int64_t p = 0; p < n_pairs; ++p) of_expert[std::size_t(pairs[std::size_t(p)].expert)].push_back(p);
  std::vector<std::int64_t> busy;
  for (std::size_t e = 0; e < of_expert.size(); ++e)
    if (!of_expert[e].empty()) busy.push_back(std::int64_t(e));
  // out[p * rows + n] = sum_i (input_p[i] * scale_p) * row_n[i] in ascending i, for every pair p of
  // row n's expert; four pairs at a time (independent sums the CPU overlaps, each in the same
  // order as alone).
  auto by_rows = [&](core::Projection which, std::int64_t rows, std::int64_t length, const auto& input,
                     std::vector<double>& out) {
    const std::int64_t chunks = (rows + kRowsPerTask - 1) / kRowsPerTask;
    core::parallel_for(std::int64_t(busy.size()) * chunks, 1, [&](std::int64_t b, std::int64_t e) {
      std::vector<double> row(static_cast<std::size_t>(length));
      for (std::int64_t task = b; task < e; ++task) {
        const std::int64_t expert = busy[std::size_t(task / chunks)], n0 = task % chunks * kRowsPerTask;
        const std::vector<std::int64_t>& of = of_expert[std::size_t(expert)];
        for (std::int64_t n = n0; n < std::min(rows, n0 + kRowsPerTask); ++n) {
          master.row(which, expert, n, row.data());
          for (std::size_t j = 0; j < of.size(); j += 4) {
            const double* v[4];
            double scale[4], sum[4] = {0.0, 0.0, 0.0, 0.0};
            for (std::size_t r = 0; r < 4; ++r) input(of[std::min(j + r, of.size() - 1)], v[r], scale[r]);
            for (std::int64_t i = 0; i < length; ++i) {
              const double w = row[std::size_t(i)];
              for (int r = 0; r < 4; ++r) sum[r] += (v[r][i] * scale[r]) * w;
            }
            for (std::size_t r = 0; r < 4 && j + r < of.size(); ++r) out[std::size_t(of[j + r] * rows + n)] = sum[r];
          }
        }
      }
    });
  };

  // GEMM1 on the inputs (times the routing weight when it goes on the input), in f64.
  std::vector<double> x(std::size_t(tokens * h));
  for (std::int64_t i = 0; i < tokens * h; ++i) x[std::size_t(i)] = bf16_to_float(in.hidden.ptr<bf16>()[i]);
  std::vector<double> g(std::size_t(n_pairs * width));
  by_rows(
      core::Projection::w13, width, h,
      [&](std::int64_t p, const double*& v, double& scale) {
        const Pair& pr = pairs[std::size_t(p)];
        v = x.data() + pr.token * h;
        scale = weights_on_input(c) ? in.topk_weights.ptr<float>()[pr.token] : 1.0;
      },
      g);
  std::vector<double> act(std::size_t(n_pairs * inter));
  core::parallel_for(n_pairs, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t p = b; p < e; ++p)
      for (std::int64_t i = 0; i < inter; ++i)
        act[std::size_t(p * inter + i)] =
            activation64(c, g[std::size_t(p * width + i)], c.gated() ? g[std::size_t(p * width + inter + i)] : 0.0);
  });
  g = {};
  // GEMM2, then the weighted sum over each token's slots in slot order.
  std::vector<double> y(std::size_t(n_pairs * h));
  by_rows(
      core::Projection::w2, h, inter,
      [&](std::int64_t p, const double*& v, double& scale) {
        v = act.data() + p * inter;
        scale = 1.0;
      },
      y);
  std::vector<double> out(std::size_t(tokens * h), 0.0);
  for (std::int64_t p = 0; p < n_pairs; ++p) {
    const Pair& pr = pairs[std::size_t(p)];
    const double weight = weights_on_input(c) ? 1.0 : slot_weight(in, pr.token, pr.slot);
    for (std::int64_t i = 0; i < h; ++i) out[std::size_t(pr.token * h + i)] += weight * y[std::size_t(p * h + i)];
  }
  return out;
}

}  // namespace moekit::cpu
