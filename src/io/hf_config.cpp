#include "io/hf_config.h"

#include <climits>
#include <initializer_list>

#include "moekit/error.h"

namespace moekit::io {
namespace {

constexpr std::int64_t kMaxSize = std::int64_t(1) << 32;

// The first of `keys` present and not null, or nullptr. Configs spell the same thing
// differently per model family and sometimes write null for "not used".
const JsonValue* first_of(const JsonValue& object, std::initializer_list<const char*> keys, std::string* found) {
  for (const char* key : keys) {
    const JsonValue* v = object.get(key);
    if (v && !v->is_null()) {
      *found = key;
      return v;
    }
  }
  return nullptr;
}

std::int64_t required_int(const JsonValue& object, const std::string& source,
                          std::initializer_list<const char*> keys, std::int64_t lo, std::int64_t hi) {
  std::string key;
  const JsonValue* v = first_of(object, keys, &key);
  if (!v) {
    std::string names;
    for (const char* k : keys) names += (names.empty() ? "" : " or ") + std::string(k);
    throw Error(source + ": missing key " + names);
  }
  return v->as_int(source + ": " + key, lo, hi);
}

std::int64_t optional_int(const JsonValue& object, const std::string& source, const char* key,
                          std::int64_t fallback) {
  std::string found;
  const JsonValue* v = first_of(object, {key}, &found);
  return v ? v->as_int(source + ": " + key, 1, INT_MAX) : fallback;
}

std::string optional_string(const JsonValue& object, const std::string& source, const char* key) {
  std::string found;
  const JsonValue* v = first_of(object, {key}, &found);
  return v ? v->as_string(source + ": " + key) : std::string();
}

Activation parse_hidden_act(const std::string& act, const std::string& source) {
  if (act.empty() || act == "silu" || act == "swish") return Activation::silu_and_mul;
  if (act == "gelu") return Activation::gelu_and_mul;
  throw Error(source + ": hidden_act: expected silu or gelu, given '" + act + "'");
}

// quantization_config: only DeepSeek-style FP8 with 128x128 blocks maps onto fp8-block.
ScaleFormat parse_quantization(const JsonValue& root, const std::string& source) {
  const JsonValue* q = root.get("quantization_config");
  if (!q || q->is_null()) return ScaleFormat::f32;
  const std::string where = source + ": quantization_config";
  q->as_object(where);
  const std::string method = optional_string(*q, where, "quant_method");
  require(method.empty() || method == "fp8",
          where + ".quant_method: expected fp8 (or no quantization), given '" + method + "'");
  if (const JsonValue* block = q->get("weight_block_size"); block && !block->is_null()) {
    const auto& sizes = block->as_array(where + ".weight_block_size");
    bool ok = sizes.size() == 2;
    for (std::size_t i = 0; ok && i < 2; ++i)
      ok = sizes[i].as_int(where + ".weight_block_size", 0, kMaxSize) == kBlock;
    require(ok, where + ".weight_block_size: expected [128, 128]");
  }
  const std::string fmt = optional_string(*q, where, "scale_fmt");
  require(fmt.empty() || fmt == "ue8m0", where + ".scale_fmt: expected ue8m0 or absent, given '" + fmt + "'");
  return fmt == "ue8m0" ? ScaleFormat::ue8m0 : ScaleFormat::f32;
}

}  // namespace

HfModelConfig parse_hf_config(const JsonValue& root, const std::string& source) {
  root.as_object(source);
  // Multimodal models (Llama-4, Qwen-VL) keep the language model's keys under text_config.
  const JsonValue* text = root.get("text_config");
  const JsonValue& c = (!root.get("hidden_size") && text && text->is_object()) ? *text : root;
  HfModelConfig hf;
  hf.hidden_size = required_int(c, source, {"hidden_size"}, 1, kMaxSize);
  hf.moe_intermediate_size = required_int(c, source, {"moe_intermediate_size", "intermediate_size"}, 1, kMaxSize);
  hf.num_experts = required_int(c, source, {"n_routed_experts", "num_experts", "num_local_experts"}, 1, kMaxSize);
  hf.top_k = int(required_int(c, source, {"num_experts_per_tok"}, 1, INT_MAX));
  hf.n_group = int(optional_int(c, source, "n_group", 1));
  hf.topk_group = int(optional_int(c, source, "topk_group", 1));
  std::string key;
  if (const JsonValue* v = first_of(c, {"routed_scaling_factor"}, &key)) {
    hf.routed_scaling_factor = float(v->as_number(source + ": routed_scaling_factor"));
  }
  hf.model_type = optional_string(c, source, "model_type");
  if (hf.model_type.empty()) hf.model_type = optional_string(root, source, "model_type");
  hf.scoring_func = optional_string(c, source, "scoring_func");
  require(hf.scoring_func.empty() || hf.scoring_func == "softmax" || hf.scoring_func == "sigmoid",
          source + ": scoring_func: expected softmax or sigmoid, given '" + hf.scoring_func + "'");
  hf.topk_method = optional_string(c, source, "topk_method");
  require(hf.topk_method.empty() || hf.topk_method == "greedy" || hf.topk_method == "noaux_tc",
          source + ": topk_method: expected greedy or noaux_tc, given '" + hf.topk_method + "'");
  if (const JsonValue* v = first_of(c, {"norm_topk_prob"}, &key)) hf.norm_topk_prob = v->as_bool(source + ": norm_topk_prob");
  hf.activation = parse_hidden_act(optional_string(c, source, "hidden_act"), source);
  hf.scale_format = parse_quantization(root, source);
  if (const JsonValue* v = first_of(c, {"num_hidden_layers"}, &key))
    hf.num_hidden_layers = v->as_int(source + ": num_hidden_layers", 0, INT_MAX);
  if (const JsonValue* v = first_of(c, {"n_shared_experts"}, &key); v && !v->is_null())
    hf.n_shared_experts = v->as_int(source + ": n_shared_experts", 0, INT_MAX);
  return hf;
}

RoutingConfig hf_routing(const HfModelConfig& hf, bool has_bias) {
  RoutingConfig r;
  r.top_k = hf.top_k;
  r.routed_scaling_factor = hf.routed_scaling_factor;
  if (hf.scoring_func == "sigmoid") {
    if (has_bias && hf.n_group > 1) {
      r.method = RoutingMethod::sigmoid_bias_grouped;
      r.n_group = hf.n_group;
      r.topk_group = hf.topk_group;
    } else if (has_bias) {
      r.method = RoutingMethod::sigmoid_bias_renorm;
    } else {
      r.method = hf.norm_topk_prob ? RoutingMethod::sigmoid_topk_renorm : RoutingMethod::sigmoid_topk;
    }
  } else if (hf.scoring_func.empty() && hf.model_type == "mixtral") {
    r.method = RoutingMethod::topk_softmax;
  } else {
    r.method = hf.norm_topk_prob ? RoutingMethod::softmax_topk_renorm : RoutingMethod::softmax_topk;
  }
  return r;
}

}  // namespace moekit::io
