#include "core/skew.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/synthetic.h"
#include "moekit/error.h"

namespace moekit::core {
namespace {

constexpr double kMaxAlpha = 100.0, kMaxBoost = 100.0;

std::string expected(std::string_view argument, std::string_view text, std::string_view why) {
  return std::string(argument) + ": " + std::string(why) +
         "expected none, zipf:ALPHA (ALPHA in [0, 100]) or hot:N:B (N >= 1 experts biased by B in [-100, 100]), given '" +
         std::string(text) + "'";
}

std::vector<std::string_view> split(std::string_view text) {
  std::vector<std::string_view> parts;
  for (;;) {
    const std::size_t colon = text.find(':');
    parts.push_back(text.substr(0, colon));
    if (colon == std::string_view::npos) return parts;
    text.remove_prefix(colon + 1);
  }
}

// A finite decimal number in [lo, hi], the whole of `part`.
bool number(std::string_view part, double lo, double hi, double& out) {
  const char* end = part.data() + part.size();
  const auto [at, error] = std::from_chars(part.data(), end, out);
  return !part.empty() && error == std::errc() && at == end && std::isfinite(out) && out >= lo && out <= hi;
}

bool count(std::string_view part, std::int64_t& out) {
  const char* end = part.data() + part.size();
  const auto [at, error] = std::from_chars(part.data(), end, out);
  return !part.empty() && error == std::errc() && at == end && out >= 1;
}

std::string shortest(double v) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, v);
  return error == std::errc() ? std::string(buffer, end) : std::to_string(v);
}

}  // namespace

std::string RouterSkew::to_string() const {
  switch (kind) {
    case SkewKind::none: return "none";
    case SkewKind::zipf: return "zipf:" + shortest(alpha);
    case SkewKind::hot: return "hot:" + std::to_string(hot) + ":" + shortest(boost);
  }
  return "none";
}

RouterSkew parse_router_skew(std::string_view text, std::string_view argument) {
  const std::vector<std::string_view> parts = split(text);
  RouterSkew s;
  if (parts[0] == "none" && parts.size() == 1) return s;
  if (parts[0] == "zipf") {
    if (parts.size() != 2) throw Error(expected(argument, text, "zipf takes one number: "));
    if (!number(parts[1], 0.0, kMaxAlpha, s.alpha)) throw Error(expected(argument, text, "bad ALPHA: "));
    s.kind = SkewKind::zipf;
    return s;
  }
  if (parts[0] == "hot") {
    if (parts.size() != 3) throw Error(expected(argument, text, "hot takes N and B: "));
    if (!count(parts[1], s.hot)) throw Error(expected(argument, text, "bad N: "));
    if (!number(parts[2], -kMaxBoost, kMaxBoost, s.boost)) throw Error(expected(argument, text, "bad B: "));
    s.kind = SkewKind::hot;
    return s;
  }
  throw Error(expected(argument, text, ""));
}

std::vector<std::int64_t> skew_ranks(std::int64_t experts, std::uint64_t seed) {
  // Fisher-Yates over the experts in rank order: order[r] is the expert of rank r.
  std::vector<std::int64_t> order(std::size_t(experts > 0 ? experts : 0));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = std::int64_t(i);
  const std::uint64_t key = mix64(seed ^ 0x736b6577ull);  // "skew": a stream of its own
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[mix64(key ^ i) % i]);
  std::vector<std::int64_t> rank(order.size());
  for (std::size_t r = 0; r < order.size(); ++r) rank[std::size_t(order[r])] = std::int64_t(r);
  return rank;
}

std::vector<float> router_skew_bias(const RouterSkew& skew, std::int64_t experts, std::uint64_t seed,
                                    std::string_view argument) {
  if (skew.kind == SkewKind::none) return {};
  if (skew.kind == SkewKind::hot && skew.hot > experts)
    throw Error(std::string(argument) + ": hot:" + std::to_string(skew.hot) + ":... biases more experts than the layer's " +
                std::to_string(experts) + "; expected N in [1, " + std::to_string(experts) + "]");
  const std::vector<std::int64_t> rank = skew_ranks(experts, seed);
  std::vector<float> bias(rank.size());
  for (std::size_t e = 0; e < rank.size(); ++e)
    bias[e] = skew.kind == SkewKind::zipf ? float(-skew.alpha * std::log(double(rank[e] + 1)))
                                          : (rank[e] < skew.hot ? float(skew.boost) : 0.0f);
  return bias;
}

void add_router_bias(const TensorView& logits, const std::vector<float>& bias) {
  if (bias.empty()) return;
  require(logits.rank == 2 && logits.is_contiguous() && logits.device == Device::cpu,
        "router skew: router_logits must be a contiguous [T, E] host tensor");
  require(logits.size(1) == std::int64_t(bias.size()), "router skew: the bias has " + std::to_string(bias.size()) +
                                                        " experts, router_logits " + std::to_string(logits.size(1)));
  require(logits.dtype == DType::f32 || logits.dtype == DType::bf16, "router skew: router_logits must be f32 or bf16");
  const std::int64_t experts = logits.size(1);
  for (std::int64_t i = 0; i < logits.numel(); ++i) {
    const float b = bias[std::size_t(i % experts)];
    if (logits.dtype == DType::f32) logits.ptr<float>()[i] += b;
    else logits.ptr<bf16>()[i] = float_to_bf16(bf16_to_float(logits.ptr<bf16>()[i]) + b);
  }
}

std::string RoutingLoad::to_string() const {
  char text[192];
  const double m = mean();
  std::snprintf(text, sizeof text, "E=%lld rows=%lld busiest=%lld (expert %lld, %.1fx the mean %.1f) empty=%lld",
                static_cast<long long>(experts), static_cast<long long>(rows), static_cast<long long>(busiest),
                static_cast<long long>(busiest_expert), m > 0 ? double(busiest) / m : 0.0, m,
                static_cast<long long>(empty));
  return text;
}

RoutingLoad routing_load(const TensorView& topk_ids, std::int64_t experts) {
  require(!topk_ids.defined() || (topk_ids.dtype == DType::i32 && topk_ids.device == Device::cpu &&
                                 topk_ids.is_contiguous()),
        "routing load: topk_ids must be contiguous i32 on the host");
  RoutingLoad load;
  load.experts = experts;
  std::vector<std::int64_t> rows(std::size_t(experts > 0 ? experts : 0), 0);
  const std::int64_t n = topk_ids.defined() ? topk_ids.numel() : 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t e = topk_ids.ptr<std::int32_t>()[i];
    if (e < 0 || e >= experts) continue;
    ++rows[std::size_t(e)];
    ++load.rows;
  }
  for (std::size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) ++load.empty;
    if (rows[e] > load.busiest) {
      load.busiest = rows[e];
      load.busiest_expert = std::int64_t(e);
    }
  }
  return load;
}

}  // namespace moekit::core
