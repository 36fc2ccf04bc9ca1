#include "moekit/config.h"

#include <array>
#include <climits>
#include <cmath>
#include <sstream>
#include <utility>

#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit {
namespace {

template <class Enum, std::size_t N>
Enum parse_enum(const std::array<std::pair<Enum, std::string_view>, N>& names, std::string_view text,
                std::string_view argument) {
  std::string valid;
  for (const auto& [value, name] : names) {
    if (name == text) return value;
    valid += (valid.empty() ? "" : "|") + std::string(name);
  }
  throw Error(std::string(argument) + ": expected one of " + valid + ", given '" + std::string(text) +
              "'");
}

template <class Enum, std::size_t N>
std::string_view enum_name(const std::array<std::pair<Enum, std::string_view>, N>& names, Enum v) {
  for (const auto& [value, name] : names)
    if (value == v) return name;
  return "?";
}

constexpr std::array<std::pair<Activation, std::string_view>, 4> kActivations{{
    {Activation::silu_and_mul, "silu_and_mul"},
    {Activation::gelu_and_mul, "gelu_and_mul"},
    {Activation::swiglu_oai, "swiglu_oai"},
    {Activation::relu2, "relu2"},
}};

constexpr std::array<std::pair<QuantScheme, std::string_view>, 4> kQuantSchemes{{
    {QuantScheme::bf16, "bf16"},
    {QuantScheme::fp8_tensor, "fp8-tensor"},
    {QuantScheme::fp8_rowwise, "fp8-rowwise"},
    {QuantScheme::fp8_block, "fp8-block"},
}};

constexpr std::array<std::pair<RoutingMethod, std::string_view>, 9> kRoutingMethods{{
    {RoutingMethod::softmax_topk, "softmax_topk"},
    {RoutingMethod::topk_softmax, "topk_softmax"},
    {RoutingMethod::softmax_topk_renorm, "softmax_topk_renorm"},
    {RoutingMethod::sigmoid_topk, "sigmoid_topk"},
    {RoutingMethod::sigmoid_topk_renorm, "sigmoid_topk_renorm"},
    {RoutingMethod::sigmoid_bias_grouped, "sigmoid_bias_grouped"},
    {RoutingMethod::sigmoid_bias_renorm, "sigmoid_bias_renorm"},
    {RoutingMethod::top1_sigmoid, "top1_sigmoid"},
    {RoutingMethod::external, "external"},
}};

constexpr std::array<std::pair<Fp8Accumulation, std::string_view>, 3> kAccumulations{{
    {Fp8Accumulation::exact, "exact"},
    {Fp8Accumulation::fast, "fast"},
    {Fp8Accumulation::strict, "strict"},
}};

constexpr std::array<std::pair<ExpertsPath, std::string_view>, 3> kExpertsPaths{{
    {ExpertsPath::automatic, "auto"},
    {ExpertsPath::staged, "staged"},
    {ExpertsPath::min_latency, "min-latency"},
}};

}  // namespace

std::string_view to_string(Activation v) { return enum_name(kActivations, v); }
std::string_view to_string(QuantScheme v) { return enum_name(kQuantSchemes, v); }
std::string_view to_string(RoutingMethod v) { return enum_name(kRoutingMethods, v); }
std::string_view to_string(ScaleFormat v) { return v == ScaleFormat::f32 ? "f32" : "ue8m0"; }
std::string_view to_string(Fp8Accumulation v) { return enum_name(kAccumulations, v); }
std::string_view to_string(ExpertsPath v) { return enum_name(kExpertsPaths, v); }
std::string_view to_string(WeightPlacement v) {
  return v == WeightPlacement::output ? "output" : "input";
}

Activation parse_activation(std::string_view text, std::string_view argument) {
  return parse_enum(kActivations, text, argument);
}
QuantScheme parse_quant_scheme(std::string_view text, std::string_view argument) {
  return parse_enum(kQuantSchemes, text, argument);
}
RoutingMethod parse_routing_method(std::string_view text, std::string_view argument) {
  return parse_enum(kRoutingMethods, text, argument);
}
Fp8Accumulation parse_fp8_accumulation(std::string_view text, std::string_view argument) {
  return parse_enum(kAccumulations, text, argument);
}
ExpertsPath parse_experts_path(std::string_view text, std::string_view argument) {
  return parse_enum(kExpertsPaths, text, argument);
}

WeightPlacement RoutingConfig::effective_placement() const {
  return method == RoutingMethod::top1_sigmoid ? WeightPlacement::input : weight_placement;
}

bool RoutingConfig::uses_bias() const {
  return method == RoutingMethod::sigmoid_bias_grouped || method == RoutingMethod::sigmoid_bias_renorm;
}

std::string RoutingConfig::to_string() const {
  std::ostringstream os;
  os << moekit::to_string(method) << " top_k=" << top_k;
  if (method == RoutingMethod::sigmoid_bias_grouped)
    os << " n_group=" << n_group << " topk_group=" << topk_group;
  if (routed_scaling_factor != 1.0f) os << " routed_scaling_factor=" << routed_scaling_factor;
  if (effective_placement() == WeightPlacement::input) os << " weights_on=input";
  return os.str();
}

std::string QuantConfig::to_string() const {
  std::string s(moekit::to_string(scheme));
  if (scale_format == ScaleFormat::ue8m0) s += " (ue8m0 scales)";
  // FP8 layers always name theirs: the default changed (DESIGN §8), so an unnamed mode would be ambiguous.
  if (scheme != QuantScheme::bf16) s += " (" + std::string(moekit::to_string(accumulation)) + " accumulation)";
  return s;
}

std::string MoEConfig::to_string() const {
  std::ostringstream os;
  os << "E=" << num_experts << " k=" << routing.top_k << " H=" << hidden_size
     << " I=" << intermediate_size << " activation=" << moekit::to_string(activation)
     << " quant=" << quant.to_string() << " routing=" << routing.to_string();
  if (ep_size > 1) os << " ep=" << ep_rank << "/" << ep_size;
  if (batch_invariant) os << " batch-invariant";
  if (experts_path != ExpertsPath::automatic) os << " path=" << moekit::to_string(experts_path);
  if (shared_experts > 0) {
    os << " shared_experts=" << shared_experts;
    if (shared_expert_weight != 1.0f) os << " (weight " << shared_expert_weight << ")";
  }
  return os.str();
}

void validate(const RoutingConfig& r, std::int64_t num_experts) {
  // moekit::route checks its config at every call: the messages are made only when a check fails.
  const auto e = [&] { return std::to_string(num_experts); };
  require(r.top_k >= 1 && r.top_k <= num_experts, [&] {
    return "top_k: expected 1 <= top_k <= num_experts (" + e() + "), given " + std::to_string(r.top_k);
  });
  require(r.n_group >= 1 && num_experts % r.n_group == 0, [&] {
    return "n_group: expected a divisor of num_experts (" + e() + "), given " + std::to_string(r.n_group);
  });
  require(r.topk_group >= 1 && r.topk_group <= r.n_group, [&] {
    return "topk_group: expected 1 <= topk_group <= n_group (" + std::to_string(r.n_group) + "), given " +
           std::to_string(r.topk_group);
  });
  const std::int64_t reachable = std::int64_t(r.topk_group) * (num_experts / r.n_group);
  require(r.top_k <= reachable, [&] {
    return "top_k: expected at most topk_group * num_experts / n_group (" + std::to_string(reachable) + "), given " +
           std::to_string(r.top_k);
  });
  require(r.routed_scaling_factor > 0.0f,
          [&] { return "routed_scaling_factor: expected > 0, given " + std::to_string(r.routed_scaling_factor); });
  require(r.method != RoutingMethod::top1_sigmoid || r.top_k == 1,
          [&] { return "top_k: top1_sigmoid routes to exactly one expert, given " + std::to_string(r.top_k); });
  require(r.effective_placement() == WeightPlacement::output || r.top_k == 1,
          [&] { return "weight_placement: input placement needs top_k == 1, given top_k " + std::to_string(r.top_k); });
}

void validate(const MoEConfig& c) {
  // 2^40 each: far past any model, and small enough that 2 I, ceil_div and the block counts
  // never overflow; the products of sizes go through checked_mul (tensor.h).
  constexpr std::int64_t kMaxSize = std::int64_t(1) << 40;
  const std::string limit = std::to_string(kMaxSize);
  require(c.num_experts >= 1 && c.num_experts <= kMaxSize,
          "num_experts: expected 1 <= num_experts <= " + limit + ", given " + std::to_string(c.num_experts));
  require(c.hidden_size >= 1 && c.hidden_size <= kMaxSize,
          "hidden_size: expected 1 <= hidden_size <= " + limit + ", given " + std::to_string(c.hidden_size));
  require(c.intermediate_size >= 1 && c.intermediate_size <= kMaxSize,
          "intermediate_size: expected 1 <= intermediate_size <= " + limit + ", given " +
              std::to_string(c.intermediate_size));
  validate(c.routing, c.num_experts);
  require(c.ep_size >= 1, "ep_size: expected >= 1, given " + std::to_string(c.ep_size));
  require(c.num_experts % c.ep_size == 0, "ep_size: expected a divisor of num_experts (" +
                                              std::to_string(c.num_experts) + "), given " +
                                              std::to_string(c.ep_size));
  require(c.ep_rank >= 0 && c.ep_rank < c.ep_size, "ep_rank: expected 0 <= ep_rank < ep_size (" +
                                                       std::to_string(c.ep_size) + "), given " +
                                                       std::to_string(c.ep_rank));
  if (c.quant.scheme == QuantScheme::fp8_block) {
    require(c.intermediate_size % kBlock == 0,
            "intermediate_size: fp8-block needs a multiple of 128 (gate and up rows must not share "
            "a scale block), given " + std::to_string(c.intermediate_size));
    require(c.hidden_size % 16 == 0,
            "hidden_size: fp8-block needs a multiple of 16, given " + std::to_string(c.hidden_size));
  }
  require(c.quant.scale_format == ScaleFormat::f32 || c.quant.scheme != QuantScheme::bf16,
          "scale_format: ue8m0 scales need an fp8 quant scheme, given bf16");
  require(c.quant.accumulation == QuantConfig{}.accumulation || c.quant.scheme != QuantScheme::bf16,
          "accumulation: " + std::string(to_string(c.quant.accumulation)) +
              " FP8 accumulation needs an fp8 quant scheme, given bf16");
  require(!c.batch_invariant || c.quant.scheme != QuantScheme::fp8_tensor,
          "batch_invariant: fp8-tensor quantizes the activations with one scale from the whole batch's "
          "amax, so a token's output depends on the other tokens; use fp8-block, fp8-rowwise or bf16");
  require(c.swiglu_limit > 0.0f,
          "swiglu_limit: expected > 0, given " + std::to_string(c.swiglu_limit));
  // The stages see k + S slots per token and E_local + S experts per rank (i32 ids): kept small.
  constexpr std::int64_t kMaxShared = 1 << 16;
  require(c.shared_experts >= 0 && c.shared_experts <= kMaxShared,
          "shared_experts: expected 0 <= shared_experts <= " + std::to_string(kMaxShared) + ", given " +
              std::to_string(c.shared_experts));
  require(c.shared_experts == 0 || c.num_experts + std::int64_t(c.ep_size) * c.shared_experts <= INT32_MAX,
          "shared_experts: the experts' ids (num_experts + ep_size * shared_experts) must fit i32, given " +
              std::to_string(c.shared_experts) + " with num_experts " + std::to_string(c.num_experts));
  require(std::isfinite(c.shared_expert_weight),
          "shared_expert_weight: expected a finite number, given " + std::to_string(c.shared_expert_weight));
  // The input placement scales the one hidden row by the routed weight before the experts: a
  // shared expert would run on that scaled row (Llama-4 runs its shared expert on the plain one).
  require(c.shared_experts == 0 || c.routing.effective_placement() == WeightPlacement::output,
          "shared_experts: the routing weights go on the input (" + c.routing.to_string() +
              "), where shared experts would see the routed weight; given " + std::to_string(c.shared_experts));
}

}  // namespace moekit
