#include "io/checkpoint.h"

#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "io/hf_config.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit::io {
namespace {

namespace fs = std::filesystem;

// The safetensors files of a checkpoint folder and which one holds each tensor. Shards are
// opened on first use, so a layer's import touches only the shards that hold it.
class CheckpointFiles {
 public:
  explicit CheckpointFiles(const std::string& folder) : folder_(folder) {
    const fs::path index = folder_ / "model.safetensors.index.json";
    const fs::path single = folder_ / "model.safetensors";
    // error_code overloads: a permission problem must surface as moekit::Error, not filesystem_error.
    std::error_code ec;
    if (fs::exists(index, ec)) {
      const std::string source = index.string();
      const JsonValue root = read_json_file(source);
      const JsonValue* map = root.get("weight_map");
      require(map != nullptr, source + ": missing key weight_map");
      for (const auto& [name, file] : map->as_object(source + ": weight_map")) {
        const std::string& relative = file.as_string(source + ": weight_map '" + name + "'");
        const fs::path p(relative);
        bool escapes = p.empty() || p.is_absolute();
        for (const auto& part : p) escapes = escapes || part == "..";
        require(!escapes, source + ": weight_map '" + name + "': expected a file inside the folder, given '" +
                              relative + "'");
        weight_map_[name] = relative;
      }
    } else if (fs::exists(single, ec)) {
      SafetensorsReader reader(single.string());
      for (const auto& name : reader.names()) weight_map_[name] = "model.safetensors";
      open_.emplace("model.safetensors", std::move(reader));
    } else {
      throw Error(folder + ": neither model.safetensors nor model.safetensors.index.json found");
    }
  }

  bool contains(const std::string& name) const { return weight_map_.count(name) != 0; }

  // "<folder>/<shard>" for messages, or the folder when the tensor is not listed.
  std::string where(const std::string& name) const {
    const auto it = weight_map_.find(name);
    return it == weight_map_.end() ? folder_.string() : (folder_ / it->second).string();
  }

  const SafetensorsReader& reader(const std::string& name) {
    const auto it = weight_map_.find(name);
    require(it != weight_map_.end(), folder_.string() + ": tensor '" + name + "' not found in the checkpoint");
    auto open = open_.find(it->second);
    if (open == open_.end()) open = open_.emplace(it->second, SafetensorsReader((folder_ / it->second).string())).first;
    require(open->second.contains(name), where(name) + ": tensor '" + name +
                                             "' is listed in the index for this file, but the file does not hold it");
    return open->second;
  }

 private:
  fs::path folder_;
  std::map<std::string, std::string> weight_map_;  // tensor -> file relative to the folder
  std::map<std::string, SafetensorsReader> open_;  // file -> reader
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Finds tensor `name` and checks its shape and dtype; the Error names the tensor and its file.
const TensorInfo& expect_tensor(CheckpointFiles& files, const std::string& name,
                                const std::vector<std::int64_t>& shape, const std::vector<DType>& dtypes) {
  const TensorInfo& info = files.reader(name).info(name);
  bool dtype_ok = false;
  std::string dtype_list;
  for (const DType d : dtypes) {
    dtype_ok = dtype_ok || d == info.dtype;
    dtype_list += (dtype_list.empty() ? "" : "|") + std::string(to_string(d));
  }
  require(dtype_ok && info.shape == shape, files.where(name) + ": tensor '" + name + "': expected " +
                                               shape_text(shape) + " " + dtype_list + ", given " +
                                               shape_text(info.shape) + " " + std::string(to_string(info.dtype)));
  return info;
}

float load_float(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.ptr<float>()[i];
    case DType::bf16: return bf16_to_float(t.ptr<bf16>()[i]);
    case DType::f16: return f16_to_float(t.ptr<std::uint16_t>()[i]);
    default: throw Error("checkpoint: cannot convert " + std::string(to_string(t.dtype())) + " to a float");
  }
}

// Reads tensor `name` into dst as `dst_dtype` (f32, bf16, or the stored dtype): straight
// into place when the dtypes agree, through a temporary when it must be converted.
void read_as(CheckpointFiles& files, const std::string& name, void* dst, DType dst_dtype) {
  const SafetensorsReader& reader = files.reader(name);
  const TensorInfo& info = reader.info(name);
  if (info.dtype == dst_dtype) {
    reader.read_into(name, dst, info.end - info.begin);
    return;
  }
  const Tensor stored = reader.read(name);
  for (std::int64_t i = 0; i < stored.numel(); ++i) {
    const float v = load_float(stored, i);
    if (dst_dtype == DType::f32) static_cast<float*>(dst)[i] = v;
    else static_cast<bf16*>(dst)[i] = float_to_bf16(v);
  }
}

// The two naming schemes of per-expert MoE tensors in HF checkpoints.
struct NameScheme {
  const char* moe;  // module under model.layers.N
  const char* gate;
  const char* up;
  const char* down;
};

constexpr NameScheme kSchemes[] = {
    {"mlp", "gate_proj", "up_proj", "down_proj"},  // DeepSeek, Qwen
    {"block_sparse_moe", "w1", "w3", "w2"},        // Mixtral, MiniMax
};

struct LayerNames {
  std::string prefix;  // "model.layers.N.mlp."
  const NameScheme* scheme = nullptr;

  std::string router() const { return prefix + "gate.weight"; }
  std::string expert(std::int64_t e, const char* proj, const char* suffix) const {
    return prefix + "experts." + std::to_string(e) + "." + proj + suffix;
  }
};

LayerNames find_layer(const CheckpointFiles& files, const std::string& folder, int layer_index) {
  std::string tried;
  for (const NameScheme& scheme : kSchemes) {
    LayerNames names{"model.layers." + std::to_string(layer_index) + "." + scheme.moe + ".", &scheme};
    if (files.contains(names.router())) return names;
    tried += (tried.empty() ? "'" : ", '") + names.router() + "'";
  }
  throw Error(folder + ": layer " + std::to_string(layer_index) + " has no MoE router (looked for " + tried +
              "); is it a dense layer or past the last layer?");
}

// One projection of one expert: its weight [rows, cols] and, for fp8, its block scales.
struct Projection {
  std::string weight;  // tensor name; the scales are weight + "_scale_inv"
  std::int64_t rows, cols;
};

void check_projection(CheckpointFiles& files, const Projection& p, DType dtype) {
  const bool fp8 = dtype == DType::fp8_e4m3;
  expect_tensor(files, p.weight, {p.rows, p.cols},
                fp8 ? std::vector<DType>{DType::fp8_e4m3} : std::vector<DType>{DType::bf16, DType::f16, DType::f32});
  if (fp8)
    expect_tensor(files, p.weight + "_scale_inv", {ceil_div(p.rows, kBlock), ceil_div(p.cols, kBlock)},
                  {DType::f32, DType::bf16});
}

// Into place (checked by check_projection): the weight at `weight`, fp8 scales at `scale`.
void read_projection(CheckpointFiles& files, const Projection& p, void* weight, float* scale, DType dtype) {
  read_as(files, p.weight, weight, dtype);
  if (dtype == DType::fp8_e4m3) read_as(files, p.weight + "_scale_inv", scale, DType::f32);
}

}  // namespace

namespace {

// Everything an import decides from config.json and the safetensors headers, every tensor's
// shape and dtype checked; no tensor data read yet.
struct ImportPlan {
  MoEConfig config;
  LayerNames names;
  std::string bias_name;  // empty when the checkpoint has none
  DType weight_dtype = DType::bf16;
  std::vector<std::int64_t> w13_shape, w2_shape;

  std::array<Projection, 3> projections(std::int64_t e) const {
    const std::int64_t h = config.hidden_size, i = config.intermediate_size;
    return {Projection{names.expert(e, names.scheme->gate, ".weight"), i, h},
            Projection{names.expert(e, names.scheme->up, ".weight"), i, h},
            Projection{names.expert(e, names.scheme->down, ".weight"), h, i}};
  }
  // The shared experts' one MLP: gate and up [S I, H], down [H, S I].
  std::array<Projection, 3> shared_projections() const {
    const std::int64_t h = config.hidden_size, width = config.shared_experts * config.intermediate_size;
    const std::string p = names.prefix + "shared_experts.";
    return {Projection{p + "gate_proj.weight", width, h}, Projection{p + "up_proj.weight", width, h},
            Projection{p + "down_proj.weight", h, width}};
  }
};

ImportPlan plan_import(CheckpointFiles& files, const std::string& folder, const HfModelConfig& hf,
                       const std::string& config_path, int layer_index, const ImportOptions& options) {
  ImportPlan plan;
  plan.names = find_layer(files, folder, layer_index);
  const LayerNames& names = plan.names;
  for (const std::string& candidate : {names.prefix + "gate.e_score_correction_bias", names.prefix + "e_score_correction_bias"})
    if (plan.bias_name.empty() && files.contains(candidate)) plan.bias_name = candidate;
  require(hf.topk_method != "noaux_tc" || !plan.bias_name.empty(),
          folder + ": tensor '" + names.prefix + "gate.e_score_correction_bias' not found, but config.json's "
                   "topk_method noaux_tc needs it");

  MoEConfig& c = plan.config;
  c.num_experts = hf.num_experts;
  c.hidden_size = hf.hidden_size;
  c.intermediate_size = hf.moe_intermediate_size;
  c.activation = hf.activation;
  c.routing = hf_routing(hf, !plan.bias_name.empty());
  c.ep_size = options.ep_size;
  c.ep_rank = options.ep_rank;
  auto validated = [&] {
    try {
      validate(c);
    } catch (const Error& e) {
      throw Error(config_path + ": " + e.what());
    }
  };
  if (options.shared_experts != 0) {
    require(hf.n_shared_experts > 0, config_path + ": shared_experts: config.json has no n_shared_experts (DeepSeek's "
                                                   "shared experts; a gated shared expert, as Qwen2-MoE's, is not fused)");
    require(options.shared_experts == hf.n_shared_experts,
            config_path + ": shared_experts: expected config.json's n_shared_experts " +
                std::to_string(hf.n_shared_experts) + ", given " + std::to_string(options.shared_experts));
    c.shared_experts = options.shared_experts;
  }
  validated();  // before any expert index is formed from ep_size/ep_rank
  // The first local expert's gate weight decides the scheme; every other tensor must agree.
  const std::string probe = names.expert(c.first_local_expert(), names.scheme->gate, ".weight");
  plan.weight_dtype = files.reader(probe).info(probe).dtype == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16;
  if (plan.weight_dtype == DType::fp8_e4m3) {
    c.quant.scheme = QuantScheme::fp8_block;
    c.quant.scale_format = hf.scale_format;
    validated();  // fp8-block adds its own shape rules
  }

  const std::int64_t el = c.weight_experts(), h = c.hidden_size, i = c.intermediate_size;
  // Sizes each allowed by config.json can still multiply past int64 (issue #19): the products
  // first, then every tensor's shape against the config, and only then (import_hf_layer) any
  // allocation, so that what is allocated is no more than the files hold.
  const std::string layer_text = config_path + ": layer " + std::to_string(layer_index);
  plan.w13_shape = {el, checked_mul(2, i, layer_text + " w13"), h};
  plan.w2_shape = {el, h, i};
  checked_nbytes(plan.weight_dtype, plan.w13_shape, layer_text + " w13 [E_local + S, 2 moe_intermediate_size, hidden_size]");
  checked_nbytes(plan.weight_dtype, plan.w2_shape, layer_text + " w2 [E_local + S, hidden_size, moe_intermediate_size]");
  checked_nbytes(DType::f32, {c.num_experts, h}, layer_text + " router [num_experts, hidden_size]");
  for (std::int64_t x = 0; x < c.local_experts(); ++x)
    for (const Projection& p : plan.projections(c.first_local_expert() + x)) check_projection(files, p, plan.weight_dtype);
  if (c.shared_experts > 0)
    for (const Projection& p : plan.shared_projections()) check_projection(files, p, plan.weight_dtype);
  const std::vector<DType> floats{DType::f32, DType::bf16, DType::f16};
  expect_tensor(files, names.router(), {c.num_experts, h}, floats);
  if (!plan.bias_name.empty()) expect_tensor(files, plan.bias_name, {c.num_experts}, floats);
  return plan;
}

// The shared experts' MLP (checked by plan_import), split into its S experts after the routed
// ones: expert s takes channels [s I, (s + 1) I), rows of gate and up, columns of down (and the
// 128-blocks of their scales: I % 128 == 0 for fp8-block).
void read_shared(CheckpointFiles& files, const ImportPlan& plan, CheckpointLayer& out) {
  const MoEConfig& c = plan.config;
  const DType dtype = plan.weight_dtype;
  const bool fp8 = dtype == DType::fp8_e4m3;
  const std::int64_t h = c.hidden_size, i = c.intermediate_size, shared = c.shared_experts;
  const std::int64_t hb = ceil_div(h, kBlock), ib = ceil_div(i, kBlock);
  const std::size_t unit = dtype_size(dtype);
  const std::array<Projection, 3> projections = plan.shared_projections();
  std::array<Tensor, 3> w, scale;  // gate, up, down: whole
  for (std::size_t n = 0; n < 3; ++n) {
    const Projection& p = projections[n];
    w[n] = Tensor(dtype, {p.rows, p.cols}, p.weight);
    if (fp8) scale[n] = Tensor(DType::f32, {ceil_div(p.rows, kBlock), ceil_div(p.cols, kBlock)}, p.weight + "_scale_inv");
    read_projection(files, p, w[n].view().data, fp8 ? scale[n].ptr<float>() : nullptr, dtype);
  }
  auto bytes = [](const Tensor& t, std::int64_t offset, std::size_t size) { return t.ptr<unsigned char>() + offset * std::int64_t(size); };
  for (std::int64_t s = 0; s < shared; ++s) {
    const std::int64_t x = c.local_experts() + s;
    unsigned char* w13 = bytes(out.w13, x * 2 * i * h, unit);
    std::memcpy(w13, bytes(w[0], s * i * h, unit), std::size_t(i * h) * unit);
    std::memcpy(w13 + std::size_t(i * h) * unit, bytes(w[1], s * i * h, unit), std::size_t(i * h) * unit);
    for (std::int64_t r = 0; r < h; ++r)
      std::memcpy(bytes(out.w2, (x * h + r) * i, unit), bytes(w[2], r * shared * i + s * i, unit), std::size_t(i) * unit);
    if (!fp8) continue;
    float* s13 = out.w13_scale.ptr<float>() + x * 2 * ib * hb;
    std::memcpy(s13, scale[0].ptr<float>() + s * ib * hb, sizeof(float) * std::size_t(ib * hb));
    std::memcpy(s13 + ib * hb, scale[1].ptr<float>() + s * ib * hb, sizeof(float) * std::size_t(ib * hb));
    for (std::int64_t rb = 0; rb < hb; ++rb)
      std::memcpy(out.w2_scale.ptr<float>() + (x * hb + rb) * ib, scale[2].ptr<float>() + rb * shared * ib + s * ib,
                  sizeof(float) * std::size_t(ib));
  }
}

HfModelConfig read_config(const std::string& folder, const std::string& config_path, int layer_index) {
  std::error_code ec;
  require(fs::is_directory(folder, ec), folder + ": not a checkpoint folder");
  const HfModelConfig hf = parse_hf_config(read_json_file(config_path), config_path);
  require(layer_index >= 0 && (hf.num_hidden_layers < 0 || layer_index < hf.num_hidden_layers),
          "layer_index: expected 0 <= layer_index < num_hidden_layers (" + std::to_string(hf.num_hidden_layers) +
              ") of " + config_path + ", given " + std::to_string(layer_index));
  return hf;
}

}  // namespace

MoEConfig inspect_hf_layer(const std::string& folder, int layer_index, const ImportOptions& options) {
  const std::string config_path = (fs::path(folder) / "config.json").string();
  const HfModelConfig hf = read_config(folder, config_path, layer_index);
  CheckpointFiles files(folder);
  return plan_import(files, folder, hf, config_path, layer_index, options).config;
}

CheckpointLayer import_hf_layer(const std::string& folder, int layer_index, const ImportOptions& options) {
  const std::string config_path = (fs::path(folder) / "config.json").string();
  const HfModelConfig hf = read_config(folder, config_path, layer_index);
  CheckpointFiles files(folder);
  const ImportPlan plan = plan_import(files, folder, hf, config_path, layer_index, options);
  const MoEConfig& c = plan.config;
  const DType weight_dtype = plan.weight_dtype;

  CheckpointLayer out;
  out.config = c;
  const std::int64_t el = c.weight_experts(), h = c.hidden_size, i = c.intermediate_size;
  const std::int64_t hb = ceil_div(h, kBlock), ib = ceil_div(i, kBlock);
  const bool fp8 = weight_dtype == DType::fp8_e4m3;
  out.w13 = Tensor(weight_dtype, plan.w13_shape, "w13");
  out.w2 = Tensor(weight_dtype, plan.w2_shape, "w2");
  if (fp8) {
    out.w13_scale = Tensor(DType::f32, {el, 2 * ib, hb}, "w13_scale");  // I % 128 == 0 (validated): gate, up blocks stack
    out.w2_scale = Tensor(DType::f32, {el, hb, ib}, "w2_scale");
  }
  const std::size_t unit = dtype_size(weight_dtype);
  auto* w13 = out.w13.ptr<unsigned char>();
  auto* w2 = out.w2.ptr<unsigned char>();
  for (std::int64_t x = 0; x < c.local_experts(); ++x) {
    const auto [gate, up, down] = plan.projections(c.first_local_expert() + x);
    unsigned char* gate_rows = w13 + std::size_t(x * 2 * i * h) * unit;  // [I, H] gate rows, then [I, H] up rows
    float* gate_scale = fp8 ? out.w13_scale.ptr<float>() + x * 2 * ib * hb : nullptr;
    read_projection(files, gate, gate_rows, gate_scale, weight_dtype);
    read_projection(files, up, gate_rows + std::size_t(i * h) * unit, fp8 ? gate_scale + ib * hb : nullptr,
                    weight_dtype);
    read_projection(files, down, w2 + std::size_t(x * h * i) * unit,
                    fp8 ? out.w2_scale.ptr<float>() + x * hb * ib : nullptr, weight_dtype);
  }

  if (c.shared_experts > 0) read_shared(files, plan, out);

  out.gate_weight = Tensor(DType::f32, {c.num_experts, h}, "router " + plan.names.router());
  read_as(files, plan.names.router(), out.gate_weight.view().data, DType::f32);
  if (!plan.bias_name.empty()) {
    out.e_score_correction_bias = Tensor(DType::f32, {c.num_experts}, "e_score_correction_bias");
    read_as(files, plan.bias_name, out.e_score_correction_bias.view().data, DType::f32);
  }
  return out;
}

}  // namespace moekit::io
