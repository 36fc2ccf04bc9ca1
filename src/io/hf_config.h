// A Hugging Face config.json, reduced to what one MoE layer needs, and the mapping of its
// routing keys (scoring_func, norm_topk_prob, topk_method, n_group) onto moekit's methods.
#pragma once

#include <cstdint>
#include <string>

#include "io/json.h"
#include "moekit/config.h"

namespace moekit::io {

struct HfModelConfig {
  std::int64_t hidden_size = 0;
  std::int64_t moe_intermediate_size = 0;  // moe_intermediate_size, else intermediate_size
  std::int64_t num_experts = 0;            // n_routed_experts | num_experts | num_local_experts
  int top_k = 0;                           // num_experts_per_tok
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  std::string model_type;
  std::string scoring_func;  // "softmax" | "sigmoid"; empty when the file does not say
  std::string topk_method;   // "" | "greedy" | "noaux_tc"
  bool norm_topk_prob = false;
  Activation activation = Activation::silu_and_mul;
  ScaleFormat scale_format = ScaleFormat::f32;  // quantization_config.scale_fmt "ue8m0"
  std::int64_t num_hidden_layers = -1;          // -1 when absent
  std::int64_t n_shared_experts = 0;            // DeepSeek's shared experts; 0 when absent
};

// Reads the keys above from config.json's root (or its "text_config" for multimodal
// models). `source` names the file in errors.
HfModelConfig parse_hf_config(const JsonValue& root, const std::string& source);

// sigmoid + bias + n_group > 1 -> sigmoid_bias_grouped; sigmoid + bias -> sigmoid_bias_renorm;
// sigmoid -> sigmoid_topk(_renorm); Mixtral -> topk_softmax; softmax -> softmax_topk(_renorm).
RoutingConfig hf_routing(const HfModelConfig& hf, bool has_bias);

}  // namespace moekit::io
