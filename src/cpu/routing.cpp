// CPU reference routing (DESIGN §3), the oracle the other backends are tested against.
//
// Per token, independently of every other token:
//   1. read the token's logits as f32 (bf16 converts exactly);
//   2. scores: softmax, sigmoid, or sigmoid plus the selection bias;
//   3. select the top k (sigmoid_bias_grouped first keeps the best groups);
//   4. weights from the unbiased scores, renormalized where the method says;
//   5. multiply by routed_scaling_factor.
//
// routed_scaling_factor multiplies the weights of every method, not only the two whose
// row in DESIGN §3 names it (sigmoid_bias_grouped, sigmoid_bias_renorm). The models
// behind the other rows use 1.0, where the product is exact and the table holds to the
// bit; a caller who sets another factor (GLM-style scaling on a softmax router, say)
// gets it applied rather than silently dropped.
//
// NaN logits: every selection ranks NaN below every number (ranks_above), so a NaN is
// picked only once the numbers run out and ids always stay in [0, E). Softmax leaves a
// NaN logit out of the max and the sum, so the numbers' probabilities stay numbers.

#include "cpu/routing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "moekit/error.h"

namespace moekit::cpu {
namespace {

using Ids = std::span<std::int32_t>;
using Scores = std::span<const float>;

// The order of every selection: a higher score first, a NaN after every number, and among
// equals the lower index first. It is total, so a selection has exactly one answer.
bool ranks_above(float a, std::size_t a_index, float b, std::size_t b_index) {
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return a_index < b_index;
}

// Writes the indices of the best best.size() scores into `best`, best first, considering
// only indices where `eligible` is nonzero (an empty `eligible` admits all). Each pass takes
// the best of those ranked below the previous pick: with a total order that is exactly
// "not taken yet", so no scratch memory is needed.
void select_top(Scores score, std::span<const std::uint8_t> eligible, Ids best) {
  for (std::size_t slot = 0; slot < best.size(); ++slot) {
    std::size_t pick = score.size();  // none yet
    for (std::size_t e = 0; e < score.size(); ++e) {
      if (!eligible.empty() && !eligible[e]) continue;
      if (slot > 0) {
        const auto previous = std::size_t(best[slot - 1]);
        if (!ranks_above(score[previous], previous, score[e], e)) continue;
      }
      if (pick == score.size() || ranks_above(score[e], e, score[pick], pick)) pick = e;
    }
    best[slot] = std::int32_t(pick);
  }
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// p = softmax(x), summing in index order. `p` may alias `x`. A NaN logit is left out of
// the max and the sum (its p is NaN), so one NaN cannot turn every probability into NaN
// and then into a tie that selection would break towards the NaN.
void softmax(Scores x, std::span<float> p) {
  float max = std::numeric_limits<float>::quiet_NaN();
  for (const float v : x)
    if (!std::isnan(v) && (std::isnan(max) || v > max)) max = v;
  float sum = 0.0f;
  for (std::size_t e = 0; e < x.size(); ++e) {
    const float v = x[e];
    p[e] = std::exp(v - max);
    if (!std::isnan(v)) sum += p[e];
  }
  for (float& v : p) v /= sum;
}

void sigmoid_all(Scores x, std::span<float> s) {
  for (std::size_t e = 0; e < x.size(); ++e) s[e] = sigmoid(x[e]);
}

// w[j] = s[ids[j]]  // [k]
void gather(Scores s, std::span<const std::int32_t> ids, std::span<float> w) {
  for (std::size_t j = 0; j < ids.size(); ++j) w[j] = s[std::size_t(ids[j])];
}

// w /= Σw, summing in slot order. A sum of 0 happens only when every selected sigmoid
// underflowed (logits below about -88); the weights then stay 0 instead of becoming 0/0.
void renormalize(std::span<float> w) {
  float sum = 0.0f;
  for (const float v : w) sum += v;
  if (sum == 0.0f) return;
  for (float& v : w) v /= sum;
}

// Memory one thread reuses for its tokens.
struct Scratch {
  std::vector<float> logits;              // [E] the token's logits as f32
  std::vector<float> scores;              // [E] unbiased scores s (softmax or sigmoid)
  std::vector<float> choice;              // [E] s + bias: what the bias methods select on
  std::vector<std::uint8_t> eligible;     // [E] experts of the kept groups
  std::vector<float> group_scores;        // [n_group]
  std::vector<std::int32_t> kept_groups;  // [topk_group]

  Scratch(const RoutingConfig& config, std::size_t num_experts)
      : logits(num_experts), scores(num_experts), choice(num_experts), eligible(num_experts),
        group_scores(std::size_t(config.n_group)), kept_groups(std::size_t(config.topk_group)) {}
};

// DeepSeek-V3's group limit: a group scores the sum of its two best choice scores (its only
// score when it has one expert); the experts of the topk_group best groups stay eligible.
// A NaN among a group's two best makes its score NaN, so it ranks after every group of
// numbers; the NaN rule then holds within the kept groups.
void keep_best_groups(Scratch& scratch) {
  const std::size_t group_size = scratch.choice.size() / scratch.group_scores.size();
  for (std::size_t g = 0; g < scratch.group_scores.size(); ++g) {
    const Scores members = Scores(scratch.choice).subspan(g * group_size, group_size);
    std::array<std::int32_t, 2> best{};
    const Ids top = Ids(best).first(std::min<std::size_t>(2, group_size));
    select_top(members, {}, top);
    float sum = 0.0f;
    for (const std::int32_t i : top) sum += members[std::size_t(i)];
    scratch.group_scores[g] = sum;
  }
  select_top(scratch.group_scores, {}, scratch.kept_groups);
  std::fill(scratch.eligible.begin(), scratch.eligible.end(), std::uint8_t{0});
  for (const std::int32_t g : scratch.kept_groups)
    std::fill_n(scratch.eligible.begin() + std::ptrdiff_t(std::size_t(g) * group_size),
                group_size, std::uint8_t{1});
}

// One token: scratch.logits holds its logits; writes its ids and weights  // [k]
void route_token(const RoutingConfig& config, Scores bias, Scratch& scratch, Ids ids,
                 std::span<float> weights) {
  const Scores x = scratch.logits;
  std::span<float> s = scratch.scores;
  std::span<float> choice = scratch.choice;
  switch (config.method) {
    case RoutingMethod::softmax_topk:
    case RoutingMethod::softmax_topk_renorm:
      softmax(x, s);
      select_top(s, {}, ids);
      gather(s, ids, weights);
      if (config.method == RoutingMethod::softmax_topk_renorm) renormalize(weights);
      break;
    case RoutingMethod::topk_softmax:
      select_top(x, {}, ids);
      gather(x, ids, weights);
      softmax(weights, weights);
      break;
    case RoutingMethod::sigmoid_topk:
    case RoutingMethod::sigmoid_topk_renorm:
      sigmoid_all(x, s);
      select_top(s, {}, ids);
      gather(s, ids, weights);
      if (config.method == RoutingMethod::sigmoid_topk_renorm) renormalize(weights);
      break;
    case RoutingMethod::sigmoid_bias_grouped:
    case RoutingMethod::sigmoid_bias_renorm:
      sigmoid_all(x, s);
      for (std::size_t e = 0; e < s.size(); ++e) choice[e] = s[e] + bias[e];
      if (config.method == RoutingMethod::sigmoid_bias_grouped) keep_best_groups(scratch);
      select_top(choice, config.method == RoutingMethod::sigmoid_bias_grouped
                             ? std::span<const std::uint8_t>(scratch.eligible)
                             : std::span<const std::uint8_t>(),
                 ids);
      gather(s, ids, weights);  // the bias chooses, it never weighs
      renormalize(weights);
      break;
    case RoutingMethod::top1_sigmoid:
      select_top(x, {}, ids);  // argmax of the logits
      weights[0] = sigmoid(x[std::size_t(ids[0])]);
      break;
    case RoutingMethod::external:
      break;  // rejected by route_tokens before any token
  }
  for (float& w : weights) w *= config.routed_scaling_factor;
}

// Element i of a contiguous f32 or bf16 tensor, as f32.
float load_f32(const TensorView& t, std::int64_t i) {
  return t.dtype == DType::bf16 ? bf16_to_float(t.ptr<const bf16>()[i]) : t.ptr<const float>()[i];
}

}  // namespace

void route_tokens(const RoutingConfig& config, const RoutingInputs& in, const RoutingOutputs& out) {
  require(config.method != RoutingMethod::external,
          "method: external routing is given by the caller, there is nothing to compute");
  const std::int64_t num_tokens = in.router_logits.size(0);
  const std::int64_t num_experts = in.router_logits.size(1);
  const auto k = std::size_t(config.top_k);
  std::vector<float> bias;  // [E] as f32
  if (config.uses_bias())
    for (std::int64_t e = 0; e < num_experts; ++e) bias.push_back(load_f32(in.bias, e));

  // Tokens are independent; a chunk of a few thousand scores keeps threads busy.
  const std::int64_t grain = std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(num_experts, 1));
  core::parallel_for(num_tokens, grain, [&](std::int64_t begin, std::int64_t end) {
    Scratch scratch(config, std::size_t(num_experts));
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t e = 0; e < num_experts; ++e)
        scratch.logits[std::size_t(e)] = load_f32(in.router_logits, t * num_experts + e);
      const Ids ids(out.topk_ids.ptr<std::int32_t>() + std::size_t(t) * k, k);
      const std::span<float> weights(out.topk_weights.ptr<float>() + std::size_t(t) * k, k);
      route_token(config, bias, scratch, ids, weights);
    }
  });
}

}  // namespace moekit::cpu
