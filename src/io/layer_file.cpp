#include "io/layer_file.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "core/validate.h"
#include "io/safetensors.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit::io {
namespace {

// ---- metadata -------------------------------------------------------------------------

using Metadata = std::map<std::string, std::string>;

const std::string* find(const Metadata& m, const std::string& key) {
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

const std::string& required(const Metadata& m, const std::string& key) {
  const std::string* value = find(m, key);
  require(value != nullptr, "metadata: missing key '" + key + "'");
  return *value;
}

std::int64_t to_int(const std::string& key, const std::string& text, std::int64_t lo, std::int64_t hi) {
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(ec == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi,
          "metadata '" + key + "': expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "], given '" + text + "'");
  return value;
}

float to_float(const std::string& key, const std::string& text) {
  float value = 0.0f;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(ec == std::errc() && end == text.data() + text.size() && std::isfinite(value),
          "metadata '" + key + "': expected a finite number, given '" + text + "'");
  return value;
}

// Shortest text that parses back to the same float.
std::string float_text(float value) {
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, ec == std::errc() ? end : buffer);
}

std::int64_t meta_int(const Metadata& m, const std::string& key, std::int64_t lo, std::int64_t hi) {
  return to_int(key, required(m, key), lo, hi);
}

// The enum spellings other than config.h's parsers.
template <class Enum>
Enum parse_choice(const std::string& key, const std::string& text, std::initializer_list<std::pair<Enum, const char*>> choices) {
  std::string valid;
  for (const auto& [value, name] : choices) {
    if (text == name) return value;
    valid += (valid.empty() ? "" : "|") + std::string(name);
  }
  throw Error("metadata '" + key + "': expected one of " + valid + ", given '" + text + "'");
}

enum class W13Order : std::uint8_t { gate_up, up_gate };

W13Order parse_w13_order(const Metadata& m) {
  const std::string* text = find(m, "w13_order");
  if (!text) return W13Order::gate_up;
  return parse_choice<W13Order>("w13_order", *text, {{W13Order::gate_up, "gate_up"}, {W13Order::up_gate, "up_gate"}});
}

// ---- tensor checks --------------------------------------------------------------------

// What the file (or the LayerFile being written) holds, before any data is read.
struct Signature {
  DType dtype;
  std::vector<std::int64_t> shape;
};
using Signatures = std::map<std::string, Signature>;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Expected {
  std::vector<DType> dtypes;
  std::vector<std::vector<std::int64_t>> shapes;  // any one of them
};

void check(const Signatures& s, const std::string& name, const Expected& expected) {
  const Signature& given = s.at(name);
  const bool dtype_ok = std::find(expected.dtypes.begin(), expected.dtypes.end(), given.dtype) != expected.dtypes.end();
  const bool shape_ok = std::find(expected.shapes.begin(), expected.shapes.end(), given.shape) != expected.shapes.end();
  if (dtype_ok && shape_ok) return;
  std::string want;
  for (const auto& shape : expected.shapes) want += (want.empty() ? "" : " or ") + shape_text(shape);
  want += " ";
  for (std::size_t i = 0; i < expected.dtypes.size(); ++i) want += (i ? "|" : "") + std::string(to_string(expected.dtypes[i]));
  throw Error(name + ": expected " + want + ", given " + shape_text(given.shape) + " " + std::string(to_string(given.dtype)));
}

void check_if_present(const Signatures& s, const std::string& name, const Expected& expected) {
  if (s.count(name)) check(s, name, expected);
}

// The scales' expected shapes for a quant scheme (DESIGN §4).
void check_scales(const MoEConfig& c, const Signatures& s) {
  const std::int64_t e = c.weight_experts(), w = c.gemm1_width(), h = c.hidden_size, i = c.intermediate_size;
  const QuantScheme q = c.quant.scheme;
  const std::string quant(to_string(q));
  if (q == QuantScheme::bf16) {
    for (const char* name : {"w13_scale", "w2_scale", "w13_input_scale", "w2_input_scale"})
      require(!s.count(name), std::string(name) + ": quant bf16 takes no scales, but the tensor is present");
    return;
  }
  for (const char* name : {"w13_scale", "w2_scale"})
    require(s.count(name), std::string(name) + ": required by quant " + quant + ", but absent");
  auto with = [](std::vector<std::vector<std::int64_t>> shapes) { return Expected{{DType::f32}, std::move(shapes)}; };
  if (q == QuantScheme::fp8_tensor) {
    check(s, "w13_scale", with({{e}, {e, 1}}));
    check(s, "w2_scale", with({{e}, {e, 1}}));
    check_if_present(s, "w13_input_scale", with({{1}}));
    check_if_present(s, "w2_input_scale", with({{1}}));
    return;
  }
  for (const char* name : {"w13_input_scale", "w2_input_scale"})
    require(!s.count(name), std::string(name) + ": static input scales need quant fp8-tensor, given " + quant);
  if (q == QuantScheme::fp8_rowwise) {
    check(s, "w13_scale", with({{e, w}}));
    check(s, "w2_scale", with({{e, h}}));
  } else {
    check(s, "w13_scale", with({{e, ceil_div(w, kBlock), ceil_div(h, kBlock)}}));
    check(s, "w2_scale", with({{e, ceil_div(h, kBlock), ceil_div(i, kBlock)}}));
  }
}

void check_tensors(const MoEConfig& c, const Signatures& s) {
  const std::int64_t e = c.weight_experts(), w = c.gemm1_width(), h = c.hidden_size, i = c.intermediate_size;
  const std::int64_t k = c.top_k();
  require(s.count("hidden"), "hidden: required, but absent");
  const Signature& hidden = s.at("hidden");
  const std::int64_t t = hidden.shape.empty() ? 0 : hidden.shape[0];
  check(s, "hidden", {{DType::bf16}, {{t, h}}});

  const bool has_ids = s.count("topk_ids") != 0, has_weights = s.count("topk_weights") != 0;
  require(has_ids == has_weights, std::string(has_ids ? "topk_weights" : "topk_ids") +
                                      ": external routing needs both topk_ids and topk_weights, given only " +
                                      (has_ids ? "topk_ids" : "topk_weights"));
  require(has_ids || s.count("router_logits"),
          "router_logits: required unless topk_ids and topk_weights are given, but absent");
  require(has_ids || c.routing.method != RoutingMethod::external,
          "topk_ids: routing external needs topk_ids and topk_weights, but they are absent");
  check_if_present(s, "router_logits", {{DType::f32, DType::bf16}, {{t, c.num_experts}}});
  check_if_present(s, "topk_ids", {{DType::i32}, {{t, k}}});
  check_if_present(s, "topk_weights", {{DType::f32}, {{t, k}}});
  require(!(c.routing.uses_bias() && s.count("router_logits")) || s.count("e_score_correction_bias"),
          "e_score_correction_bias: required by routing " + std::string(to_string(c.routing.method)) +
              ", but absent");
  check_if_present(s, "e_score_correction_bias", {{DType::f32, DType::bf16}, {{c.num_experts}}});
  // What the file says the layer computes: checked as strictly as the inputs, since a reader
  // compares them element by element with the layer's outputs (issue #19).
  check_if_present(s, "expected_out", {{DType::bf16}, {{t, h}}});
  check_if_present(s, "expected_topk_ids", {{DType::i32}, {{t, k}}});
  check_if_present(s, "expected_topk_weights", {{DType::f32}, {{t, k}}});

  const DType weight = c.quant.scheme == QuantScheme::bf16 ? DType::bf16 : DType::fp8_e4m3;
  for (const char* name : {"w13", "w2"}) require(s.count(name), std::string(name) + ": required, but absent");
  check(s, "w13", {{weight}, {{e, w, h}}});
  check(s, "w2", {{weight}, {{e, h, i}}});
  check_scales(c, s);
}

// ---- the tensors of a LayerFile by name ------------------------------------------------

constexpr std::array<std::pair<const char*, Tensor LayerFile::*>, 11> kFields{{
    {"hidden", &LayerFile::hidden},
    {"router_logits", &LayerFile::router_logits},
    {"topk_ids", &LayerFile::topk_ids},
    {"topk_weights", &LayerFile::topk_weights},
    {"w13", &LayerFile::w13},
    {"w2", &LayerFile::w2},
    {"w13_scale", &LayerFile::w13_scale},
    {"w2_scale", &LayerFile::w2_scale},
    {"e_score_correction_bias", &LayerFile::e_score_correction_bias},
    {"w13_input_scale", &LayerFile::w13_input_scale},
    {"w2_input_scale", &LayerFile::w2_input_scale},
}};

Tensor LayerFile::* field(const std::string& name) {
  for (const auto& [field_name, member] : kFields)
    if (name == field_name) return member;
  return nullptr;
}

// Swaps the two halves of each of `outer` consecutive blocks (TensorRT-LLM's up|gate -> gate|up).
void swap_halves(Tensor& t, std::int64_t outer) {
  if (!t.defined() || outer == 0) return;
  const std::size_t block = t.nbytes() / std::size_t(outer), half = block / 2;
  auto* bytes = t.ptr<unsigned char>();
  for (std::int64_t o = 0; o < outer; ++o) {
    unsigned char* first = bytes + std::size_t(o) * block;
    std::swap_ranges(first, first + half, first + half);
  }
}

Tensor reshaped_copy(const Tensor& t, std::vector<std::int64_t> shape) {
  Tensor out(t.dtype(), std::move(shape));
  std::memcpy(out.view().data, t.view().data, t.nbytes());
  return out;
}

}  // namespace

std::map<std::string, std::string> config_metadata(const MoEConfig& c) {
  Metadata m;
  m["num_experts"] = std::to_string(c.num_experts);
  m["top_k"] = std::to_string(c.routing.top_k);
  m["hidden_size"] = std::to_string(c.hidden_size);
  m["intermediate_size"] = std::to_string(c.intermediate_size);
  m["routing"] = std::string(to_string(c.routing.method));
  m["n_group"] = std::to_string(c.routing.n_group);
  m["topk_group"] = std::to_string(c.routing.topk_group);
  m["routed_scaling_factor"] = float_text(c.routing.routed_scaling_factor);
  m["activation"] = std::string(to_string(c.activation));
  m["quant"] = std::string(to_string(c.quant.scheme));
  if (c.ep_size != 1) {
    m["ep_size"] = std::to_string(c.ep_size);
    m["ep_rank"] = std::to_string(c.ep_rank);
  }
  if (c.quant.scale_format != ScaleFormat::f32) m["scale_format"] = std::string(to_string(c.quant.scale_format));
  if (c.routing.weight_placement != WeightPlacement::output)
    m["weight_placement"] = std::string(to_string(c.routing.weight_placement));
  if (c.activation == Activation::swiglu_oai) {
    m["swiglu_alpha"] = float_text(c.swiglu_alpha);
    m["swiglu_limit"] = float_text(c.swiglu_limit);
  }
  if (c.shared_experts != 0) {
    m["shared_experts"] = std::to_string(c.shared_experts);
    m["shared_expert_weight"] = float_text(c.shared_expert_weight);
  }
  return m;
}

MoEConfig parse_config_metadata(const std::map<std::string, std::string>& m) {
  constexpr std::int64_t kMaxSize = std::int64_t(1) << 40;
  MoEConfig c;
  c.num_experts = meta_int(m, "num_experts", 0, kMaxSize);
  c.routing.top_k = int(meta_int(m, "top_k", INT_MIN, INT_MAX));
  c.hidden_size = meta_int(m, "hidden_size", 0, kMaxSize);
  c.intermediate_size = meta_int(m, "intermediate_size", 0, kMaxSize);
  c.routing.method = parse_routing_method(required(m, "routing"), "metadata 'routing'");
  c.routing.n_group = int(meta_int(m, "n_group", INT_MIN, INT_MAX));
  c.routing.topk_group = int(meta_int(m, "topk_group", INT_MIN, INT_MAX));
  c.routing.routed_scaling_factor = to_float("routed_scaling_factor", required(m, "routed_scaling_factor"));
  c.activation = parse_activation(required(m, "activation"), "metadata 'activation'");
  c.quant.scheme = parse_quant_scheme(required(m, "quant"), "metadata 'quant'");
  if (const std::string* v = find(m, "ep_size")) c.ep_size = int(to_int("ep_size", *v, INT_MIN, INT_MAX));
  if (const std::string* v = find(m, "ep_rank")) c.ep_rank = int(to_int("ep_rank", *v, INT_MIN, INT_MAX));
  if (const std::string* v = find(m, "scale_format"))
    c.quant.scale_format =
        parse_choice<ScaleFormat>("scale_format", *v, {{ScaleFormat::f32, "f32"}, {ScaleFormat::ue8m0, "ue8m0"}});
  if (const std::string* v = find(m, "weight_placement"))
    c.routing.weight_placement = parse_choice<WeightPlacement>(
        "weight_placement", *v, {{WeightPlacement::output, "output"}, {WeightPlacement::input, "input"}});
  if (const std::string* v = find(m, "swiglu_alpha")) c.swiglu_alpha = to_float("swiglu_alpha", *v);
  if (const std::string* v = find(m, "swiglu_limit")) c.swiglu_limit = to_float("swiglu_limit", *v);
  if (const std::string* v = find(m, "shared_experts")) c.shared_experts = to_int("shared_experts", *v, INT_MIN, INT_MAX);
  if (const std::string* v = find(m, "shared_expert_weight")) c.shared_expert_weight = to_float("shared_expert_weight", *v);
  validate(c);
  return c;
}

namespace {

// What the header says, checked: the config, w13's order, every tensor's dtype and shape.
struct Header {
  MoEConfig config;
  W13Order order = W13Order::gate_up;
  Signatures signatures;
};

Header checked_header(const SafetensorsReader& reader) {
  Header h;
  h.config = parse_config_metadata(reader.metadata());
  h.order = parse_w13_order(reader.metadata());
  require(h.order == W13Order::gate_up || h.config.gated(),
          "metadata 'w13_order': up_gate needs a gated activation (w13 has gate and up halves), given " +
              std::string(to_string(h.config.activation)));
  for (const auto& name : reader.names()) h.signatures[name] = {reader.info(name).dtype, reader.info(name).shape};
  check_tensors(h.config, h.signatures);
  return h;
}

}  // namespace

LayerFileInfo inspect_layer_file(const std::string& path) {
  const SafetensorsReader reader(path);
  try {
    const Header h = checked_header(reader);
    LayerFileInfo info;
    info.config = h.config;
    info.tokens = h.signatures.at("hidden").shape[0];
    info.has_router_logits = h.signatures.count("router_logits") != 0;
    info.has_topk = h.signatures.count("topk_ids") != 0;
    for (const auto& [name, signature] : h.signatures)
      if (!field(name)) info.extra.push_back(name);
    return info;
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

LayerFile read_layer_file(const std::string& path) {
  const SafetensorsReader reader(path);
  LayerFile file;
  W13Order order = W13Order::gate_up;
  try {
    const Header h = checked_header(reader);
    file.config = h.config;
    order = h.order;
    for (const auto& name : reader.names()) {
      Tensor LayerFile::*member = field(name);
      (member ? file.*member : file.extra[name]) = reader.read(name);
    }
    // The CPU reference indexes with the ids; a GPU run would drop the ones out of range.
    if (file.topk_ids.defined()) core::check_topk_ids(file.topk_ids.view(), file.config.num_experts);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  if (file.config.quant.scheme == QuantScheme::fp8_tensor) {
    // [E_local, 1] is accepted on input; the Weights contract is [E_local].
    auto flatten = [](Tensor& scale) {
      if (scale.shape().size() == 2) scale = reshaped_copy(scale, {scale.size(0)});
    };
    flatten(file.w13_scale);
    flatten(file.w2_scale);
  }
  if (order == W13Order::up_gate) {
    const std::int64_t e = file.config.weight_experts();
    swap_halves(file.w13, e);
    const QuantScheme q = file.config.quant.scheme;
    if (q == QuantScheme::fp8_rowwise || q == QuantScheme::fp8_block) swap_halves(file.w13_scale, e);
  }
  return file;
}

void write_layer_file(const std::string& path, const LayerViews& layer, const std::vector<NamedTensor>& extra) {
  const std::pair<const char*, TensorView> fields[] = {
      {"hidden", layer.hidden},
      {"router_logits", layer.router_logits},
      {"topk_ids", layer.topk_ids},
      {"topk_weights", layer.topk_weights},
      {"w13", layer.weights.w13},
      {"w2", layer.weights.w2},
      {"w13_scale", layer.weights.w13_scale},
      {"w2_scale", layer.weights.w2_scale},
      {"e_score_correction_bias", layer.weights.e_score_correction_bias},
      {"w13_input_scale", layer.weights.w13_input_scale},
      {"w2_input_scale", layer.weights.w2_input_scale},
  };
  static_assert(std::size(fields) == kFields.size(), "every LayerFile tensor has a view");
  std::vector<NamedTensor> tensors;
  Signatures signatures;
  try {
    validate(layer.config);
    for (const auto& [name, view] : fields) {
      if (!view.defined()) continue;
      require(view.device == Device::cpu, std::string(name) + ": expected a host tensor");
      require(view.is_contiguous(), std::string(name) + ": expected a contiguous row-major tensor");
      signatures[name] = {view.dtype, view.shape_vector()};
      tensors.push_back({name, view});
    }
    for (const NamedTensor& t : extra) {
      require(field(t.name) == nullptr, "extra '" + t.name + "': the name belongs to a layer tensor");
      require(t.view.defined(), "extra '" + t.name + "': the tensor is absent");
      signatures[t.name] = {t.view.dtype, t.view.shape_vector()};
      tensors.push_back(t);
    }
    check_tensors(layer.config, signatures);
    if (layer.topk_ids.defined()) core::check_topk_ids(layer.topk_ids, layer.config.num_experts);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  write_safetensors(path, tensors, config_metadata(layer.config));
}

void write_layer_file(const std::string& path, const LayerFile& file) {
  std::vector<NamedTensor> extra;
  for (const auto& [name, t] : file.extra) extra.push_back({name, t.view()});
  write_layer_file(path,
                   LayerViews{file.config, file.hidden.view(), file.router_logits.view(), file.topk_ids.view(),
                              file.topk_weights.view(), file.weights()},
                   extra);
}

}  // namespace moekit::io
