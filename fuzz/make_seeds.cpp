// Writes the seed corpus of the fuzz targets with moekit's own writers: small valid inputs of
// each parser, a few KB each. Usage: fuzz_make_seeds <fuzz/corpus>. The output is committed;
// run again (scripts/fuzz.sh --seeds) when a format grows.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/synthetic.h"
#include "io/layer_file.h"
#include "io/safetensors.h"
#include "io/tuning_cache.h"
#include "moekit/moekit.h"
#include "moekit/quant.h"

namespace {

using namespace moekit;
namespace fs = std::filesystem;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

Tensor filled(DType dtype, std::vector<std::int64_t> shape, std::uint8_t salt) {
  Tensor t(dtype, std::move(shape));
  for (std::size_t i = 0; i < t.nbytes(); ++i) t.ptr<std::uint8_t>()[i] = std::uint8_t(i * 37 + salt);
  return t;
}

MoEConfig tiny(QuantScheme quant, RoutingMethod method) {
  MoEConfig c;
  c.num_experts = quant == QuantScheme::fp8_block ? 2 : 4;  // fp8-block: I = 128, the smallest
  c.hidden_size = 16;
  c.intermediate_size = quant == QuantScheme::fp8_block ? 128 : 16;
  c.routing.top_k = method == RoutingMethod::top1_sigmoid || c.num_experts == 2 ? 1 : 2;
  c.routing.method = method;
  if (method == RoutingMethod::sigmoid_bias_grouped) c.routing.n_group = 2, c.routing.topk_group = 1;
  c.quant.scheme = quant;
  return c;
}

// A layer file of `c` with T = 3 tokens: synthetic weights, random-looking inputs.
void layer_file(const fs::path& path, const MoEConfig& c, bool external) {
  const core::SyntheticLayer w = core::make_synthetic_layer(c, 7);
  const Tensor hidden = core::make_hidden(3, c.hidden_size, 7);
  const Tensor logits = core::make_router_logits(3, c.num_experts, DType::f32, 7);
  Tensor ids(DType::i32, {3, c.top_k()}), weights(DType::f32, {3, c.top_k()});
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    ids.ptr<std::int32_t>()[i] = std::int32_t((i * 3) % (c.num_experts + 1)) - 1;
    weights.ptr<float>()[i] = 0.25f * float(i + 1);
  }
  const Tensor expected = filled(DType::bf16, {3, c.hidden_size}, 1);
  fs::create_directories(path.parent_path());
  io::write_layer_file(path.string(),
                       io::LayerViews{c, hidden.view(), external ? TensorView{} : logits.view(),
                                      external ? ids.view() : TensorView{}, external ? weights.view() : TensorView{},
                                      w.weights()},
                       {{"expected_out", expected.view()}});
}

// A Hugging Face folder as the hf_checkpoint target reads it: config.json, NUL, model.safetensors.
std::string checkpoint(const std::string& config, bool fp8, std::int64_t e, std::int64_t h, std::int64_t i,
                       bool bias, const fs::path& scratch) {
  std::vector<Tensor> keep;
  std::vector<io::NamedTensor> tensors;
  auto add = [&](const std::string& name, Tensor t) {
    keep.push_back(std::move(t));
    tensors.push_back({name, keep.back().view()});
  };
  keep.reserve(64);
  const std::string p = "model.layers.1.mlp.";
  add(p + "gate.weight", filled(DType::bf16, {e, h}, 3));
  if (bias) add(p + "gate.e_score_correction_bias", filled(DType::f32, {e}, 4));
  const char* proj[] = {"gate_proj", "up_proj", "down_proj"};
  for (std::int64_t x = 0; x < e; ++x)
    for (int j = 0; j < 3; ++j) {
      const std::int64_t rows = j == 2 ? h : i, cols = j == 2 ? i : h;
      const std::string name = p + "experts." + std::to_string(x) + "." + proj[j] + ".weight";
      add(name, filled(fp8 ? DType::fp8_e4m3 : DType::bf16, {rows, cols}, std::uint8_t(x * 3 + j)));
      if (fp8) add(name + "_scale_inv", filled(DType::f32, {ceil_div(rows, kBlock), ceil_div(cols, kBlock)}, 9));
    }
  const fs::path file = scratch / "model.safetensors";
  io::write_safetensors(file.string(), tensors, {{"format", "pt"}});
  return config + std::string(1, '\0') + slurp(file);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds <corpus folder>\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path scratch = fs::temp_directory_path() / "moekit_make_seeds";
  fs::create_directories(scratch);

  // layer_file (and safetensors): one file per quant scheme, both routing modes.
  layer_file(out / "layer_file" / "bf16_softmax_topk", tiny(QuantScheme::bf16, RoutingMethod::softmax_topk), false);
  layer_file(out / "layer_file" / "bf16_external", tiny(QuantScheme::bf16, RoutingMethod::external), true);
  layer_file(out / "layer_file" / "fp8_tensor_top1", tiny(QuantScheme::fp8_tensor, RoutingMethod::top1_sigmoid), false);
  layer_file(out / "layer_file" / "fp8_rowwise_topk_softmax", tiny(QuantScheme::fp8_rowwise, RoutingMethod::topk_softmax), false);
  layer_file(out / "layer_file" / "fp8_block_grouped", tiny(QuantScheme::fp8_block, RoutingMethod::sigmoid_bias_grouped), false);

  // safetensors: every dtype, metadata, an empty tensor, a scalar, and a small layer file.
  {
    fs::create_directories(out / "safetensors");
    std::vector<Tensor> keep;
    std::vector<io::NamedTensor> tensors;
    const std::pair<const char*, DType> dtypes[] = {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16},
                                                    {"fp8", DType::fp8_e4m3}, {"i32", DType::i32}, {"i64", DType::i64},
                                                    {"u8", DType::u8}};
    keep.reserve(16);
    for (const auto& [name, dtype] : dtypes) {
      keep.push_back(filled(dtype, {2, 3}, 5));
      tensors.push_back({name, keep.back().view()});
    }
    keep.push_back(filled(DType::f32, {0, 4}, 0));
    tensors.push_back({"empty", keep.back().view()});
    keep.push_back(filled(DType::f32, {}, 6));
    tensors.push_back({"scalar", keep.back().view()});
    keep.push_back(filled(DType::u8, {1, 1, 2, 1}, 8));
    tensors.push_back({"rank4", keep.back().view()});
    io::write_safetensors((out / "safetensors" / "dtypes").string(), tensors, {{"format", "pt"}, {"note", "\"q\"\n"}});
    io::write_safetensors((out / "safetensors" / "empty").string(), {}, {});
    put(out / "safetensors" / "layer_bf16", slurp(out / "layer_file" / "bf16_softmax_topk"));
  }

  // json: the documents moekit reads, and the grammar's corners.
  put(out / "json" / "config_deepseek",
      R"({"model_type":"deepseek_v3","hidden_size":7168,"moe_intermediate_size":2048,"n_routed_experts":256,)"
      R"("num_experts_per_tok":8,"n_group":8,"topk_group":4,"routed_scaling_factor":2.5,"scoring_func":"sigmoid",)"
      R"("topk_method":"noaux_tc","norm_topk_prob":true,"quantization_config":{"quant_method":"fp8",)"
      R"("weight_block_size":[128,128],"scale_fmt":"ue8m0"},"num_hidden_layers":61,"rope_scaling":null})");
  put(out / "json" / "index", R"({"metadata":{"total_size":123},"weight_map":{"a.weight":"model-00001-of-00002.safetensors"}})");
  put(out / "json" / "header", R"({"__metadata__":{"format":"pt"},"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})");
  put(out / "json" / "corners", "[-0, 1e-5, 1.5E+3, 9007199254740993, -9223372036854775808, \"\\u00e9\\ud83d\\ude00\\n\\\"\", "
                                "true, false, null, [], {}, [[[]]], {\"a\":{\"b\":[1]}}]");
  put(out / "json" / "strings", "\"\\\\\\/\\b\\f\\n\\r\\t\\u0000\xc3\xa9\"");

  // tuning_cache: what `moekit tune` writes (per-bucket entries, a batch-invariant one), and none.
  {
    io::TuningEntry e;
    e.device = {"NVIDIA H200", 132, "13.0", "0.1.0"};
    e.problem = io::TuningProblem::of(tiny(QuantScheme::fp8_block, RoutingMethod::softmax_topk_renorm));
    e.tokens = 64;
    e.winner = {"staged gemm1=m64_n128_pingpong gemm2=m64_n128_pingpong", 220.7};
    e.runners_up = {{"staged gemm1=m128_n128_cooperative gemm2=m64_n128_pingpong", 230.25}, {"min-latency", 301}};
    e.measured = "qwen3-30b-a3b, median of 20";
    io::TuningEntry decode = e;
    decode.tokens = 1;
    decode.winner = {"min-latency", 35.3};
    decode.runners_up = {{"staged gemm1=rows8_warp_mma gemm2=rows8_warp_mma", 49.8}};
    io::TuningEntry invariant = e;
    invariant.problem.batch_invariant = true;
    invariant.tokens = 0;
    invariant.runners_up.clear();
    put(out / "tuning_cache" / "entries", io::write_tuning_cache({{e, decode, invariant}}));
    put(out / "tuning_cache" / "empty", io::write_tuning_cache({}));
  }

  // hf_checkpoint: a bf16 Qwen-style and an FP8 DeepSeek-style layer 1 (layer 0 dense).
  put(out / "hf_checkpoint" / "qwen_bf16",
      checkpoint(R"({"model_type":"qwen3_moe","hidden_size":16,"moe_intermediate_size":16,"num_experts":2,)"
                 R"("num_experts_per_tok":2,"norm_topk_prob":true,"num_hidden_layers":2})",
                 false, 2, 16, 16, false, scratch));
  put(out / "hf_checkpoint" / "deepseek_fp8",
      checkpoint(R"({"model_type":"deepseek_v3","hidden_size":16,"moe_intermediate_size":128,"n_routed_experts":1,)"
                 R"("num_experts_per_tok":1,"n_group":1,"topk_group":1,"routed_scaling_factor":2.5,)"
                 R"("scoring_func":"sigmoid","topk_method":"noaux_tc","norm_topk_prob":true,"num_hidden_layers":3,)"
                 R"("quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}})",
                 true, 1, 16, 128, true, scratch));
  fs::remove_all(scratch);
  return 0;
}
