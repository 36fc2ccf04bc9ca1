// Synthetic Hugging Face folders (config.json, shards, index) built in a temp dir, imported,
// and checked element by element.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "io/safetensors.h"
#include "moekit/error.h"
#include "moekit/quant.h"
#include "temp_dir.h"

namespace moekit::io {
namespace {

using test::TempDir;

enum class Variant { deepseek_fp8_sharded, qwen_bf16_single, mixtral_bf16_sharded };

constexpr std::int64_t kE = 4, kH = 144, kI = 256;  // H % 128 != 0: a partial last K block
constexpr int kLayer = 1;                            // layer 0 is dense
constexpr std::int64_t kShared = 100;                // the shared experts' contents, as if an expert

// Deterministic contents: every element says where it belongs (layer, expert, projection, row, col).
std::uint8_t fp8_code(int layer, std::int64_t e, int proj, std::int64_t r, std::int64_t c) {
  return std::uint8_t(layer * 31 + e * 17 + proj * 7 + r * 3 + c * 5 + (r * c) % 11);
}
std::uint16_t bf16_bits(int layer, std::int64_t e, int proj, std::int64_t r, std::int64_t c) {
  return std::uint16_t(0x3f80 + ((layer * 31 + e * 17 + proj * 7 + r * 3 + c * 5 + (r * c) % 11) & 0x7f));
}
float scale_value(int layer, std::int64_t e, int proj, std::int64_t r, std::int64_t c) {
  return 1.0f + float(layer) * 0.5f + float(e) + float(proj) * 0.125f + float(r) * 0.01f + float(c) * 0.001f;
}
float router_value(std::int64_t e, std::int64_t c) { return bf16_to_float(bf16{bf16_bits(9, e, 9, e, c)}); }

struct Generator {
  Variant variant = Variant::deepseek_fp8_sharded;
  std::string skip;         // a tensor left out
  std::string wrong_shape;  // a tensor written with one row too many
  std::int64_t shared = 0;  // n_shared_experts: DeepSeek's shared experts, one MLP of shared x kI channels

  bool fp8() const { return variant == Variant::deepseek_fp8_sharded; }
  std::string prefix(int layer) const {
    return "model.layers." + std::to_string(layer) +
           (variant == Variant::mixtral_bf16_sharded ? ".block_sparse_moe." : ".mlp.");
  }
  std::string proj_name(int proj) const {
    static const char* hf[] = {"gate_proj", "up_proj", "down_proj"};
    static const char* mixtral[] = {"w1", "w3", "w2"};
    return variant == Variant::mixtral_bf16_sharded ? mixtral[proj] : hf[proj];
  }

  std::string config_json() const {
    std::string json = routed_config_json();
    if (shared > 0) json.insert(json.size() - 1, ",\"n_shared_experts\":" + std::to_string(shared));
    return json;
  }

  std::string routed_config_json() const {
    switch (variant) {
      case Variant::deepseek_fp8_sharded:
        return R"({"model_type":"deepseek_v3","hidden_size":144,"moe_intermediate_size":256,"intermediate_size":999,
          "n_routed_experts":4,"num_experts_per_tok":2,"n_group":2,"topk_group":1,"routed_scaling_factor":2.5,
          "scoring_func":"sigmoid","topk_method":"noaux_tc","norm_topk_prob":true,"num_hidden_layers":3,
          "hidden_act":"silu","quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[128,128]}})";
      case Variant::qwen_bf16_single:
        return R"({"model_type":"qwen3_moe","hidden_size":144,"moe_intermediate_size":256,"num_experts":4,
          "num_experts_per_tok":2,"norm_topk_prob":true,"num_hidden_layers":2})";
      case Variant::mixtral_bf16_sharded:
        return R"({"model_type":"mixtral","hidden_size":144,"intermediate_size":256,"num_local_experts":4,
          "num_experts_per_tok":2,"num_hidden_layers":2})";
    }
    return "";
  }

  // tensor name -> (shard index, tensor)
  void add(std::map<std::string, std::pair<int, Tensor>>& out, const std::string& name, int shard, Tensor t) const {
    if (name != skip) out[name] = {shard, std::move(t)};
  }

  Tensor weight(int layer, std::int64_t e, int proj, std::int64_t rows, std::int64_t cols) const {
    const std::string name = prefix(layer) + "experts." + std::to_string(e) + "." + proj_name(proj) + ".weight";
    if (name == wrong_shape) ++rows;
    // One bf16 tensor stored as f32, to exercise the conversion.
    const bool as_f32 = !fp8() && e == 1 && proj == 0;
    Tensor t(fp8() ? DType::fp8_e4m3 : as_f32 ? DType::f32 : DType::bf16, {rows, cols});
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t i = r * cols + c;
        if (fp8()) t.ptr<std::uint8_t>()[i] = fp8_code(layer, e, proj, r, c);
        else if (as_f32) t.ptr<float>()[i] = bf16_to_float(bf16{bf16_bits(layer, e, proj, r, c)});
        else t.ptr<std::uint16_t>()[i] = bf16_bits(layer, e, proj, r, c);
      }
    return t;
  }

  Tensor scale(int layer, std::int64_t e, int proj, std::int64_t rows, std::int64_t cols) const {
    Tensor t(DType::f32, {ceil_div(rows, kBlock), ceil_div(cols, kBlock)});
    for (std::int64_t r = 0; r < t.size(0); ++r)
      for (std::int64_t c = 0; c < t.size(1); ++c) t.ptr<float>()[r * t.size(1) + c] = scale_value(layer, e, proj, r, c);
    return t;
  }

  // Shard 0: layer 0 (dense) and experts 0..1; shard 1: experts 2..3, router, bias.
  void write(const TempDir& dir) const {
    std::ofstream(dir.file("config.json")) << config_json();
    std::map<std::string, std::pair<int, Tensor>> tensors;
    add(tensors, "model.layers.0.mlp.gate_proj.weight", 0, Tensor(DType::bf16, {kI, kH}));
    for (std::int64_t e = 0; e < kE; ++e) {
      const int shard = e < kE / 2 ? 0 : 1;
      for (int proj = 0; proj < 3; ++proj) {
        const std::int64_t rows = proj == 2 ? kH : kI, cols = proj == 2 ? kI : kH;
        const std::string base = prefix(kLayer) + "experts." + std::to_string(e) + "." + proj_name(proj) + ".weight";
        add(tensors, base, shard, weight(kLayer, e, proj, rows, cols));
        if (fp8()) add(tensors, base + "_scale_inv", shard, scale(kLayer, e, proj, rows, cols));
      }
    }
    // The shared experts' MLP: contents of an "expert" kShared, channels [0, shared kI).
    for (int proj = 0; shared > 0 && proj < 3; ++proj) {
      const std::int64_t width = shared * kI, rows = proj == 2 ? kH : width, cols = proj == 2 ? width : kH;
      const std::string base = prefix(kLayer) + "shared_experts." + proj_name(proj) + ".weight";
      add(tensors, base, 1, weight(kLayer, kShared, proj, rows, cols));
      if (fp8()) add(tensors, base + "_scale_inv", 1, scale(kLayer, kShared, proj, rows, cols));
    }
    Tensor router(DType::bf16, {kE, kH});
    for (std::int64_t e = 0; e < kE; ++e)
      for (std::int64_t c = 0; c < kH; ++c) router.ptr<std::uint16_t>()[e * kH + c] = bf16_bits(9, e, 9, e, c);
    add(tensors, prefix(kLayer) + "gate.weight", 1, std::move(router));
    if (fp8()) {
      Tensor bias(DType::f32, {kE});
      for (std::int64_t e = 0; e < kE; ++e) bias.ptr<float>()[e] = 0.25f * float(e);
      add(tensors, prefix(kLayer) + "gate.e_score_correction_bias", 1, std::move(bias));
    }

    const bool single = variant == Variant::qwen_bf16_single;
    const std::string shard_names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    std::vector<NamedTensor> shards[2];
    std::string index = R"({"metadata":{"total_size":0},"weight_map":{)";
    bool first = true;
    for (const auto& [name, entry] : tensors) {
      shards[single ? 0 : entry.first].push_back({name, entry.second.view()});
      index += (first ? "\"" : ",\"") + name + "\":\"" + shard_names[entry.first] + "\"";
      first = false;
    }
    index += "}}";
    if (single) {
      write_safetensors(dir.file("model.safetensors"), shards[0], {{"format", "pt"}});
      return;
    }
    for (int s = 0; s < 2; ++s) write_safetensors(dir.file(shard_names[s]), shards[s], {{"format", "pt"}});
    std::ofstream(dir.file("model.safetensors.index.json")) << index;
  }
};

// Every element of w13, w2 and the scales is where the contract puts it.
void expect_layer(const CheckpointLayer& layer, const Generator& g, std::int64_t first_expert, std::int64_t local) {
  const bool fp8 = g.fp8();
  const std::int64_t held = local + g.shared;  // the shared experts after the routed ones
  ASSERT_EQ(layer.w13.shape(), (std::vector<std::int64_t>{held, 2 * kI, kH}));
  ASSERT_EQ(layer.w2.shape(), (std::vector<std::int64_t>{held, kH, kI}));
  ASSERT_EQ(layer.w13.dtype(), fp8 ? DType::fp8_e4m3 : DType::bf16);
  auto at = [&](const Tensor& t, std::int64_t i) -> std::uint32_t {
    return fp8 ? t.ptr<std::uint8_t>()[i] : t.ptr<std::uint16_t>()[i];
  };
  auto expected = [&](std::int64_t e, int proj, std::int64_t r, std::int64_t c) -> std::uint32_t {
    return fp8 ? fp8_code(kLayer, e, proj, r, c) : bf16_bits(kLayer, e, proj, r, c);
  };
  for (std::int64_t x = 0; x < local; ++x) {
    const std::int64_t e = first_expert + x;
    for (std::int64_t r = 0; r < 2 * kI; ++r)
      for (std::int64_t c = 0; c < kH; ++c)
        ASSERT_EQ(at(layer.w13, (x * 2 * kI + r) * kH + c), expected(e, r < kI ? 0 : 1, r % kI, c))
            << "w13 expert " << e << " row " << r << " col " << c;
    for (std::int64_t r = 0; r < kH; ++r)
      for (std::int64_t c = 0; c < kI; ++c)
        ASSERT_EQ(at(layer.w2, (x * kH + r) * kI + c), expected(e, 2, r, c)) << "w2 expert " << e;
    if (!fp8) continue;
    const std::int64_t ib = kI / kBlock, hb = ceil_div(kH, kBlock);
    ASSERT_EQ(layer.w13_scale.shape(), (std::vector<std::int64_t>{held, 2 * ib, hb}));
    ASSERT_EQ(layer.w2_scale.shape(), (std::vector<std::int64_t>{held, hb, ib}));
    for (std::int64_t r = 0; r < 2 * ib; ++r)
      for (std::int64_t c = 0; c < hb; ++c)
        ASSERT_EQ(layer.w13_scale.ptr<float>()[(x * 2 * ib + r) * hb + c], scale_value(kLayer, e, r < ib ? 0 : 1, r % ib, c));
    for (std::int64_t r = 0; r < hb; ++r)
      for (std::int64_t c = 0; c < ib; ++c)
        ASSERT_EQ(layer.w2_scale.ptr<float>()[(x * hb + r) * ib + c], scale_value(kLayer, e, 2, r, c));
  }
  // Shared expert s: channels [s kI, (s + 1) kI) of the MLP, rows of gate and up, columns of down.
  for (std::int64_t s = 0; s < g.shared; ++s) {
    const std::int64_t x = local + s, ch = s * kI;
    for (std::int64_t r = 0; r < 2 * kI; ++r)
      for (std::int64_t c = 0; c < kH; ++c)
        ASSERT_EQ(at(layer.w13, (x * 2 * kI + r) * kH + c), expected(kShared, r < kI ? 0 : 1, ch + r % kI, c))
            << "w13 shared expert " << s << " row " << r << " col " << c;
    for (std::int64_t r = 0; r < kH; ++r)
      for (std::int64_t c = 0; c < kI; ++c)
        ASSERT_EQ(at(layer.w2, (x * kH + r) * kI + c), expected(kShared, 2, r, ch + c)) << "w2 shared expert " << s;
    if (!fp8) continue;
    const std::int64_t ib = kI / kBlock, hb = ceil_div(kH, kBlock);
    for (std::int64_t r = 0; r < 2 * ib; ++r)
      for (std::int64_t c = 0; c < hb; ++c)
        ASSERT_EQ(layer.w13_scale.ptr<float>()[(x * 2 * ib + r) * hb + c],
                  scale_value(kLayer, kShared, r < ib ? 0 : 1, s * ib + r % ib, c));
    for (std::int64_t r = 0; r < hb; ++r)
      for (std::int64_t c = 0; c < ib; ++c)
        ASSERT_EQ(layer.w2_scale.ptr<float>()[(x * hb + r) * ib + c], scale_value(kLayer, kShared, 2, r, s * ib + c));
  }
  if (!fp8) {
    EXPECT_FALSE(layer.w13_scale.defined());
    EXPECT_FALSE(layer.w2_scale.defined());
  }
  ASSERT_EQ(layer.gate_weight.shape(), (std::vector<std::int64_t>{kE, kH}));
  ASSERT_EQ(layer.gate_weight.dtype(), DType::f32);
  for (std::int64_t e = 0; e < kE; ++e)
    for (std::int64_t c = 0; c < kH; ++c) ASSERT_EQ(layer.gate_weight.ptr<float>()[e * kH + c], router_value(e, c));
}

TEST(IoCheckpoint, DeepseekFp8ShardsImport) {
  TempDir dir;
  Generator g;
  g.write(dir);
  const CheckpointLayer layer = import_hf_layer(dir.path().string(), kLayer, {});
  const MoEConfig& c = layer.config;
  EXPECT_EQ(c.num_experts, kE);
  EXPECT_EQ(c.hidden_size, kH);
  EXPECT_EQ(c.intermediate_size, kI);  // moe_intermediate_size wins over intermediate_size
  EXPECT_EQ(c.top_k(), 2);
  EXPECT_EQ(c.quant.scheme, QuantScheme::fp8_block);
  EXPECT_EQ(c.routing.method, RoutingMethod::sigmoid_bias_grouped);
  EXPECT_EQ(c.routing.n_group, 2);
  EXPECT_EQ(c.routing.topk_group, 1);
  EXPECT_EQ(c.routing.routed_scaling_factor, 2.5f);
  ASSERT_EQ(layer.e_score_correction_bias.shape(), std::vector<std::int64_t>{kE});
  EXPECT_EQ(layer.e_score_correction_bias.ptr<float>()[3], 0.75f);
  expect_layer(layer, g, 0, kE);
  EXPECT_EQ(layer.weights().w13_scale.to_string(), "[4, 4, 2] f32 cpu");
}

TEST(IoCheckpoint, SecondEpRankReadsOnlyTheSecondHalf) {
  TempDir dir;
  Generator g;
  g.write(dir);
  // Shard 1 holds only experts 0..1: rank 1 of 2 must not need it.
  std::filesystem::remove(dir.file("model-00001-of-00002.safetensors"));
  const CheckpointLayer layer = import_hf_layer(dir.path().string(), kLayer, {2, 1});
  EXPECT_EQ(layer.config.ep_size, 2);
  EXPECT_EQ(layer.config.ep_rank, 1);
  expect_layer(layer, g, 2, 2);
}

TEST(IoCheckpoint, QwenBf16SingleFileImports) {
  TempDir dir;
  Generator g;
  g.variant = Variant::qwen_bf16_single;
  g.write(dir);
  const CheckpointLayer layer = import_hf_layer(dir.path().string(), kLayer, {});
  EXPECT_EQ(layer.config.quant.scheme, QuantScheme::bf16);
  EXPECT_EQ(layer.config.routing.method, RoutingMethod::softmax_topk_renorm);
  EXPECT_FALSE(layer.e_score_correction_bias.defined());
  expect_layer(layer, g, 0, kE);
}

TEST(IoCheckpoint, MixtralNamesImport) {
  TempDir dir;
  Generator g;
  g.variant = Variant::mixtral_bf16_sharded;
  g.write(dir);
  const CheckpointLayer layer = import_hf_layer(dir.path().string(), kLayer, {2, 0});
  EXPECT_EQ(layer.config.routing.method, RoutingMethod::topk_softmax);
  expect_layer(layer, g, 0, 2);
}

void expect_import_error(const TempDir& dir, int layer, ImportOptions options, const std::vector<std::string>& needles) {
  try {
    import_hf_layer(dir.path().string(), layer, options);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& needle : needles) EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(IoCheckpoint, SharedExpertsSplitIntoExpertsAfterTheRoutedOnes) {
  for (const Variant variant : {Variant::deepseek_fp8_sharded, Variant::qwen_bf16_single})
    for (const std::int64_t shared : {1, 2}) {
      SCOPED_TRACE(std::to_string(shared) + (variant == Variant::qwen_bf16_single ? " shared, bf16" : " shared, fp8"));
      TempDir dir;
      Generator g;
      g.variant = variant;
      g.shared = shared;
      g.write(dir);
      // EP rank 1 of 2: its two routed experts, then the shared ones every rank holds.
      const CheckpointLayer layer = import_hf_layer(dir.path().string(), kLayer, {2, 1, shared});
      EXPECT_EQ(layer.config.shared_experts, shared);
      EXPECT_EQ(inspect_hf_layer(dir.path().string(), kLayer, {2, 1, shared}).shared_experts, shared);
      expect_layer(layer, g, 2, 2);
      // Not asked for: the routed layer alone.
      Generator routed = g;
      routed.shared = 0;
      expect_layer(import_hf_layer(dir.path().string(), kLayer, {}), routed, 0, kE);
    }
}

TEST(IoCheckpoint, SharedExpertsMustBeTheCheckpointsOwn) {
  TempDir dir;
  Generator g;
  g.shared = 1;
  g.write(dir);
  expect_import_error(dir, kLayer, {1, 0, 2}, {"shared_experts", "n_shared_experts 1, given 2"});
  TempDir none;
  Generator plain;
  plain.write(none);
  expect_import_error(none, kLayer, {1, 0, 1}, {"shared_experts", "no n_shared_experts"});
  TempDir missing;
  g.skip = "model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv";
  g.write(missing);
  expect_import_error(missing, kLayer, {1, 0, 1}, {"'" + g.skip + "'"});
}

TEST(IoCheckpoint, MissingTensorIsNamed) {
  for (const std::string missing : {"model.layers.1.mlp.experts.3.down_proj.weight_scale_inv",
                                    "model.layers.1.mlp.experts.2.up_proj.weight",
                                    "model.layers.1.mlp.gate.e_score_correction_bias"}) {
    TempDir dir;
    Generator g;
    g.skip = missing;
    g.write(dir);
    expect_import_error(dir, kLayer, {}, {"'" + missing + "'"});
  }
}

TEST(IoCheckpoint, ShapeMismatchNamesTensorAndFile) {
  TempDir dir;
  Generator g;
  g.wrong_shape = "model.layers.1.mlp.experts.3.gate_proj.weight";
  g.write(dir);
  expect_import_error(dir, kLayer, {},
                      {"model-00002-of-00002.safetensors", "'" + g.wrong_shape + "'", "expected [256, 144] fp8_e4m3",
                       "given [257, 144] fp8_e4m3"});
}

TEST(IoCheckpoint, BadLayerOrOptionsFail) {
  TempDir dir;
  Generator g;
  g.write(dir);
  expect_import_error(dir, 0, {}, {"layer 0 has no MoE router", "model.layers.0.mlp.gate.weight"});
  expect_import_error(dir, 3, {}, {"layer_index", "num_hidden_layers (3)"});
  expect_import_error(dir, -1, {}, {"layer_index"});
  expect_import_error(dir, kLayer, {3, 0}, {"ep_size"});
  expect_import_error(dir, kLayer, {2, 2}, {"ep_rank"});
  EXPECT_THROW(import_hf_layer(dir.file("nowhere"), kLayer, {}), Error);
}

TEST(IoCheckpoint, UnsupportedConfigFails) {
  struct Case {
    std::string config;
    const char* needle;
  };
  const std::vector<Case> cases{
      {R"({"hidden_size":144,"num_experts":4,"num_experts_per_tok":2})", "intermediate_size"},
      {R"({"hidden_size":144,"moe_intermediate_size":256,"num_experts_per_tok":2})", "n_routed_experts or num_experts"},
      {R"({"hidden_size":144,"moe_intermediate_size":256,"num_experts":4,"num_experts_per_tok":2,"topk_method":"group_limited_greedy"})",
       "topk_method"},
      {R"({"hidden_size":144,"moe_intermediate_size":256,"num_experts":4,"num_experts_per_tok":2,"quantization_config":{"quant_method":"gptq"}})",
       "quant_method"},
      {R"({"hidden_size":144,"moe_intermediate_size":256,"num_experts":4,"num_experts_per_tok":2,"quantization_config":{"quant_method":"fp8","weight_block_size":[64,64]}})",
       "weight_block_size"},
      {R"({"hidden_size":"144","moe_intermediate_size":256,"num_experts":4,"num_experts_per_tok":2})", "hidden_size"},
      {R"({"hidden_size":144,"moe_intermediate_size":256,"num_experts":4,"num_experts_per_tok":9})", "top_k"},
      {"{not json", "invalid JSON"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    Generator g;
    g.variant = Variant::qwen_bf16_single;
    g.write(dir);
    std::ofstream(dir.file("config.json")) << c.config;
    SCOPED_TRACE(c.config);
    expect_import_error(dir, kLayer, {}, {c.needle, "config.json"});
  }
}

// Issue #19: sizes each allowed by config.json whose products overflow, or that are
// representable but far beyond what the files hold, are an Error naming the tensor; before,
// the importer allocated a wrapped size and wrote past it, or threw std::bad_alloc.
struct HostileSizes {
  const char* name;
  std::int64_t hidden, intermediate, experts;
  bool sparse_expert;  // experts.0.gate_proj.weight [intermediate, hidden] bf16, in a sparse file
  std::vector<std::string> needles;
};

class IoCheckpointHostileSizes : public ::testing::TestWithParam<HostileSizes> {};

// A single-file checkpoint whose only expert tensor has the config's (huge) shape; its data is
// a hole in a sparse file, so the test writes a few KB whatever the shape says.
void write_sparse_checkpoint(const TempDir& dir, const HostileSizes& c) {
  const std::string router = "model.layers.1.mlp.gate.weight", gate = "model.layers.1.mlp.experts.0.gate_proj.weight";
  const std::uint64_t router_bytes = 4 * 144 * 2, gate_bytes = std::uint64_t(c.intermediate * c.hidden) * 2;
  std::string header = "{\"" + router + "\":{\"dtype\":\"BF16\",\"shape\":[4,144],\"data_offsets\":[0," +
                       std::to_string(router_bytes) + "]},\"" + gate + "\":{\"dtype\":\"BF16\",\"shape\":[" +
                       std::to_string(c.intermediate) + "," + std::to_string(c.hidden) + "],\"data_offsets\":[" +
                       std::to_string(router_bytes) + "," + std::to_string(router_bytes + gate_bytes) + "]}}";
  const std::uint64_t length = header.size();
  {
    std::ofstream out(dir.file("model.safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
  }
  std::filesystem::resize_file(dir.file("model.safetensors"), 8 + length + router_bytes + gate_bytes);
}

TEST_P(IoCheckpointHostileSizes, IsAnErrorNamingTheTensor) {
  const HostileSizes& c = GetParam();
  TempDir dir;
  Generator g;
  g.variant = Variant::qwen_bf16_single;
  if (c.sparse_expert) write_sparse_checkpoint(dir, c);
  else g.write(dir);
  std::ofstream(dir.file("config.json"))
      << R"({"model_type":"qwen3_moe","num_experts_per_tok":2,"norm_topk_prob":true,"hidden_size":)" << c.hidden
      << R"(,"moe_intermediate_size":)" << c.intermediate << R"(,"num_experts":)" << c.experts << "}";
  expect_import_error(dir, kLayer, {}, c.needles);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, IoCheckpointHostileSizes,
    ::testing::Values(
        // 2^32 experts x [2 x 2^15, 2^15] bf16: 2^64 bytes, 0 once wrapped.
        HostileSizes{"product_wraps", 32768, 32768, std::int64_t(1) << 32, true, {"config.json", "w13", "more elements than int64 holds"}},
        // 16 TB of w13: representable, and no file holds its tensors.
        HostileSizes{"huge_shapes",
                     1 << 20,
                     1 << 20,
                     4,
                     false,
                     {"'model.layers.1.mlp.experts.0.gate_proj.weight'", "expected [1048576, 1048576]"}},
        // 2^32 experts of the file's own size: the fifth expert is not there.
        HostileSizes{"many_experts", kH, kI, std::int64_t(1) << 32, false, {"'model.layers.1.mlp.experts.4.gate_proj.weight' not found"}}),
    [](const ::testing::TestParamInfo<HostileSizes>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moekit::io
