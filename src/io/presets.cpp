#include "io/presets.h"

#include <cstdio>

#include "moekit/error.h"

namespace moekit::io {
namespace {

struct Row {
  const char* name;
  std::int64_t h, i, e;
  int k;
  RoutingMethod method;
  int n_group, topk_group;
  float factor;
  Activation activation;
  QuantScheme quant;
  const char* note;
  std::int64_t shared;  // n_shared_experts
};

MoEConfig config_of(const Row& r) {
  MoEConfig c;
  c.hidden_size = r.h;
  c.intermediate_size = r.i;
  c.num_experts = r.e;
  c.routing.top_k = r.k;
  c.routing.method = r.method;
  c.routing.n_group = r.n_group;
  c.routing.topk_group = r.topk_group;
  c.routing.routed_scaling_factor = r.factor;
  c.activation = r.activation;
  c.quant.scheme = r.quant;
  return c;
}

std::vector<Preset> build() {
  using A = Activation;
  using Q = QuantScheme;
  using R = RoutingMethod;
  const Row rows[] = {
      {"deepseek-v3", 7168, 2048, 256, 8, R::sigmoid_bias_grouped, 8, 4, 2.5f, A::silu_and_mul, Q::fp8_block,
       "DeepSeek-V3/R1: 8 groups, 4 kept, x2.5", 1},
      {"qwen3-30b-a3b", 2048, 768, 128, 8, R::softmax_topk_renorm, 1, 1, 1.0f, A::silu_and_mul, Q::fp8_block,
       "Qwen3-30B-A3B (norm_topk_prob)", 0},
      {"qwen3-235b-a22b", 4096, 1536, 128, 8, R::softmax_topk_renorm, 1, 1, 1.0f, A::silu_and_mul, Q::fp8_block,
       "Qwen3-235B-A22B (norm_topk_prob)", 0},
      {"mixtral-8x7b", 4096, 14336, 8, 2, R::topk_softmax, 1, 1, 1.0f, A::silu_and_mul, Q::fp8_tensor,
       "Mixtral-8x7B", 0},
      {"minimax-m2", 3072, 1536, 256, 8, R::sigmoid_bias_renorm, 1, 1, 1.0f, A::silu_and_mul, Q::fp8_block,
       "MiniMax-M2 (sigmoid + bias)", 0},
      {"llama4-scout", 5120, 8192, 16, 1, R::top1_sigmoid, 1, 1, 1.0f, A::silu_and_mul, Q::fp8_rowwise,
       "Llama-4-Scout (weight on the input: its shared expert is not fused)", 1},
      {"gpt-oss-120b", 2880, 2880, 128, 4, R::topk_softmax, 1, 1, 1.0f, A::swiglu_oai, Q::bf16,
       "gpt-oss-120b (I % 128 != 0: no fp8-block)", 0},
  };
  std::vector<Preset> list;
  for (const Row& r : rows) list.push_back({r.name, config_of(r), r.note, r.shared});
  return list;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> list = build();
  return list;
}

const Preset& find_preset(std::string_view name) {
  std::string names;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : "|") + p.name;
  }
  throw Error("preset: expected one of " + names + ", given '" + std::string(name) + "'");
}

MoEConfig with_shared(const Preset& p, std::int64_t shared) {
  require(shared == 0 || shared == p.shared_experts,
          "shared_experts: " + p.name + " has " + std::to_string(p.shared_experts) +
              " shared experts (n_shared_experts): expected 0 or " + std::to_string(p.shared_experts) + ", given " +
              std::to_string(shared));
  MoEConfig c = p.config;
  c.shared_experts = shared;
  return c;
}

std::string presets_table() {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %6s %6s %4s %2s %6s  %-22s %-13s %-12s\n", "preset", "H", "I", "E", "k",
                "shared", "routing", "activation", "quant");
  out += line;
  for (const Preset& p : presets()) {
    const MoEConfig& c = p.config;
    std::snprintf(line, sizeof line, "%-16s %6lld %6lld %4lld %2d %6lld  %-22s %-13s %-12s %s\n", p.name.c_str(),
                  static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size),
                  static_cast<long long>(c.num_experts), c.top_k(), static_cast<long long>(p.shared_experts),
                  std::string(to_string(c.routing.method)).c_str(),
                  std::string(to_string(c.activation)).c_str(), std::string(to_string(c.quant.scheme)).c_str(),
                  p.note.c_str());
    out += line;
  }
  return out;
}

}  // namespace moekit::io
