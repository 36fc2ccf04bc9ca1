#include "io/layer_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include "io/safetensors.h"
#include "moekit/error.h"
#include "moekit/quant.h"
#include "temp_dir.h"
#include "test_util.h"

namespace moekit::io {
namespace {

using test::TempDir;

Tensor random_bytes(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  Tensor t(dtype, std::move(shape));
  for (std::size_t i = 0; i < t.nbytes(); ++i) t.ptr<unsigned char>()[i] = static_cast<unsigned char>(rng());
  return t;
}

bool same(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.view().data, b.view().data, a.nbytes()) == 0;
}

// A valid layer for `config`, random contents. External routing when `external`.
LayerFile make_layer(const MoEConfig& c, std::int64_t tokens, bool external, std::mt19937_64& rng) {
  LayerFile f;
  f.config = c;
  const std::int64_t e = c.weight_experts(), w = c.gemm1_width(), h = c.hidden_size, i = c.intermediate_size;
  f.hidden = random_bytes(DType::bf16, {tokens, h}, rng);
  if (external) {
    f.topk_ids = Tensor(DType::i32, {tokens, c.top_k()});  // ids in [-1, E): random bytes are not ids
    for (std::int64_t x = 0; x < f.topk_ids.numel(); ++x)
      f.topk_ids.ptr<std::int32_t>()[x] = std::int32_t(rng() % std::uint64_t(c.num_experts + 1)) - 1;
    f.topk_weights = random_bytes(DType::f32, {tokens, c.top_k()}, rng);
  } else {
    f.router_logits = random_bytes(DType::bf16, {tokens, c.num_experts}, rng);
  }
  if (c.routing.uses_bias()) f.e_score_correction_bias = random_bytes(DType::f32, {c.num_experts}, rng);
  const DType wt = c.quant.scheme == QuantScheme::bf16 ? DType::bf16 : DType::fp8_e4m3;
  f.w13 = random_bytes(wt, {e, w, h}, rng);
  f.w2 = random_bytes(wt, {e, h, i}, rng);
  switch (c.quant.scheme) {
    case QuantScheme::bf16: break;
    case QuantScheme::fp8_tensor:
      f.w13_scale = random_bytes(DType::f32, {e}, rng);
      f.w2_scale = random_bytes(DType::f32, {e}, rng);
      f.w13_input_scale = random_bytes(DType::f32, {1}, rng);
      break;
    case QuantScheme::fp8_rowwise:
      f.w13_scale = random_bytes(DType::f32, {e, w}, rng);
      f.w2_scale = random_bytes(DType::f32, {e, h}, rng);
      break;
    case QuantScheme::fp8_block:
      f.w13_scale = random_bytes(DType::f32, {e, ceil_div(w, kBlock), ceil_div(h, kBlock)}, rng);
      f.w2_scale = random_bytes(DType::f32, {e, ceil_div(h, kBlock), ceil_div(i, kBlock)}, rng);
      break;
  }
  f.extra["expected_out"] = random_bytes(DType::bf16, {tokens, h}, rng);
  return f;
}

MoEConfig small_config(QuantScheme quant) {
  MoEConfig c;
  c.num_experts = 4;
  c.hidden_size = 160;
  c.intermediate_size = 128;
  c.routing.top_k = 2;
  c.quant.scheme = quant;
  return c;
}

void expect_error_mentions(const std::function<void()>& action, const std::string& needle) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(IoLayerFile, GoldenFileReads) {
  const LayerFile f = read_layer_file(test::data_path("golden/layer_fp8_block_small.safetensors"));
  const MoEConfig& c = f.config;
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k(), 2);
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.intermediate_size, 256);
  EXPECT_EQ(c.routing.method, RoutingMethod::softmax_topk_renorm);
  EXPECT_EQ(c.quant.scheme, QuantScheme::fp8_block);
  EXPECT_EQ(c.activation, Activation::silu_and_mul);
  EXPECT_EQ(c.ep_size, 1);
  EXPECT_EQ(f.hidden.shape(), (std::vector<std::int64_t>{32, 384}));
  EXPECT_EQ(f.router_logits.dtype(), DType::f32);
  EXPECT_FALSE(f.topk_ids.defined());
  EXPECT_FALSE(f.e_score_correction_bias.defined());
  const Weights w = f.weights();
  EXPECT_EQ(w.w13.to_string(), "[8, 512, 384] fp8_e4m3 cpu");
  EXPECT_EQ(w.w2.to_string(), "[8, 384, 256] fp8_e4m3 cpu");
  EXPECT_EQ(w.w13_scale.to_string(), "[8, 4, 3] f32 cpu");
  EXPECT_EQ(w.w2_scale.to_string(), "[8, 3, 2] f32 cpu");
  EXPECT_FALSE(w.w13_input_scale.defined());
  ASSERT_EQ(f.extra.size(), 3u);
  EXPECT_EQ(f.extra.at("expected_out").shape(), (std::vector<std::int64_t>{32, 384}));
  EXPECT_EQ(f.extra.at("expected_topk_ids").dtype(), DType::i32);
  EXPECT_EQ(f.extra.at("expected_topk_weights").shape(), (std::vector<std::int64_t>{32, 2}));
}

struct RoundTripCase {
  const char* name;
  QuantScheme quant;
  RoutingMethod routing;
  Activation activation;
  bool external;
  int ep_size, ep_rank;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << c.name; }

class IoLayerFileRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(IoLayerFileRoundTrip, WriteThenRead) {
  const RoundTripCase& p = GetParam();
  MoEConfig c = small_config(p.quant);
  c.routing.method = p.routing;
  c.activation = p.activation;
  c.ep_size = p.ep_size;
  c.ep_rank = p.ep_rank;
  if (p.routing == RoutingMethod::sigmoid_bias_grouped) {
    c.routing.n_group = 2;
    c.routing.topk_group = 1;
    c.routing.routed_scaling_factor = 2.5f;
  }
  if (p.routing == RoutingMethod::top1_sigmoid) c.routing.top_k = 1;
  if (p.quant != QuantScheme::bf16) c.quant.scale_format = ScaleFormat::ue8m0;
  if (p.activation == Activation::swiglu_oai) c.swiglu_limit = 6.5f;
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const LayerFile f = make_layer(c, 5, p.external, rng);
  TempDir dir;
  write_layer_file(dir.file("layer.safetensors"), f);
  const LayerFile g = read_layer_file(dir.file("layer.safetensors"));
  EXPECT_EQ(g.config.to_string(), c.to_string());
  EXPECT_EQ(g.config.quant.scale_format, c.quant.scale_format);
  EXPECT_EQ(g.config.swiglu_limit, c.swiglu_limit);
  EXPECT_EQ(g.config.routing.routed_scaling_factor, c.routing.routed_scaling_factor);
  for (const auto& [name, a, b] :
       {std::tuple{"hidden", &f.hidden, &g.hidden}, {"router_logits", &f.router_logits, &g.router_logits},
        {"topk_ids", &f.topk_ids, &g.topk_ids}, {"topk_weights", &f.topk_weights, &g.topk_weights},
        {"w13", &f.w13, &g.w13}, {"w2", &f.w2, &g.w2}, {"w13_scale", &f.w13_scale, &g.w13_scale},
        {"w2_scale", &f.w2_scale, &g.w2_scale}, {"bias", &f.e_score_correction_bias, &g.e_score_correction_bias},
        {"w13_input_scale", &f.w13_input_scale, &g.w13_input_scale}}) {
    EXPECT_TRUE(same(*a, *b)) << name;
  }
  ASSERT_EQ(g.extra.size(), 1u);
  EXPECT_TRUE(same(f.extra.at("expected_out"), g.extra.at("expected_out")));
}

INSTANTIATE_TEST_SUITE_P(
    , IoLayerFileRoundTrip,
    ::testing::Values(
        RoundTripCase{"Bf16Softmax", QuantScheme::bf16, RoutingMethod::softmax_topk, Activation::silu_and_mul, false, 1, 0},
        RoundTripCase{"Fp8TensorExternal", QuantScheme::fp8_tensor, RoutingMethod::external, Activation::gelu_and_mul, true, 1, 0},
        RoundTripCase{"Fp8RowwiseTop1", QuantScheme::fp8_rowwise, RoutingMethod::top1_sigmoid, Activation::relu2, false, 1, 0},
        RoundTripCase{"Fp8BlockGroupedEp2", QuantScheme::fp8_block, RoutingMethod::sigmoid_bias_grouped, Activation::silu_and_mul, false, 2, 1},
        RoundTripCase{"Fp8BlockSwigluOai", QuantScheme::fp8_block, RoutingMethod::sigmoid_bias_renorm, Activation::swiglu_oai, false, 4, 3}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(IoLayerFile, MetadataRoundTripsAndLeavesDefaultsOut) {
  MoEConfig c = small_config(QuantScheme::fp8_block);
  auto m = config_metadata(c);
  EXPECT_EQ(m.size(), 10u);
  EXPECT_EQ(m.at("quant"), "fp8-block");
  EXPECT_EQ(m.at("routed_scaling_factor"), "1");
  EXPECT_EQ(parse_config_metadata(m).to_string(), c.to_string());
  m["about"] = "unknown keys are ignored";
  m["routed_scaling_factor"] = "1.0";
  EXPECT_EQ(parse_config_metadata(m).to_string(), c.to_string());
}

// A small valid file's parts, to break one at a time.
struct Parts {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  void write(const std::string& path) const {
    std::vector<NamedTensor> named;
    for (const auto& [name, t] : tensors) named.push_back({name, t.view()});
    write_safetensors(path, named, metadata);
  }
};

Parts valid_parts(std::mt19937_64& rng) {
  const LayerFile f = make_layer(small_config(QuantScheme::fp8_block), 3, false, rng);
  Parts p;
  p.metadata = config_metadata(f.config);
  p.tensors["hidden"] = random_bytes(DType::bf16, f.hidden.shape(), rng);
  p.tensors["router_logits"] = random_bytes(DType::f32, f.router_logits.shape(), rng);
  p.tensors["w13"] = random_bytes(DType::fp8_e4m3, f.w13.shape(), rng);
  p.tensors["w2"] = random_bytes(DType::fp8_e4m3, f.w2.shape(), rng);
  p.tensors["w13_scale"] = random_bytes(DType::f32, f.w13_scale.shape(), rng);
  p.tensors["w2_scale"] = random_bytes(DType::f32, f.w2_scale.shape(), rng);
  return p;
}

TEST(IoLayerFile, MissingMetadataKeyIsNamed) {
  std::mt19937_64 rng(3);
  TempDir dir;
  for (const char* key : {"num_experts", "top_k", "hidden_size", "intermediate_size", "routing", "n_group",
                          "topk_group", "routed_scaling_factor", "activation", "quant"}) {
    Parts p = valid_parts(rng);
    p.metadata.erase(key);
    p.write(dir.file("l.safetensors"));
    expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, std::string("missing key '") + key + "'");
  }
}

TEST(IoLayerFile, BadMetadataValueIsNamed) {
  std::mt19937_64 rng(4);
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"top_k", "two"},          {"top_k", "0"},         {"top_k", "2.0"},       {"hidden_size", "-1"},
      {"num_experts", " 4"},     {"n_group", "3"},       {"topk_group", "5"},    {"routing", "softmax"},
      {"quant", "fp9"},          {"activation", "gelu"}, {"routed_scaling_factor", "abc"},
      {"routed_scaling_factor", "inf"}, {"intermediate_size", "96"},  // fp8-block needs I % 128 == 0
      {"ep_size", "3"},          {"ep_rank", "1"},       {"scale_format", "e8m0"}, {"w13_order", "sideways"},
      {"weight_placement", "input"}, {"swiglu_limit", "x"}, {"shared_experts", "-1"},
      {"shared_expert_weight", "nan"}};
  for (const auto& [key, value] : cases) {
    Parts p = valid_parts(rng);
    p.metadata[key] = value;
    p.write(dir.file("l.safetensors"));
    SCOPED_TRACE(key + "=" + value);
    expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, key);
  }
}

TEST(IoLayerFile, WrongTensorIsNamedWithExpectedAndGiven) {
  std::mt19937_64 rng(5);
  TempDir dir;
  struct Case {
    const char* tensor;
    DType dtype;
    std::vector<std::int64_t> shape;  // empty = remove the tensor
    const char* message;
  };
  const std::vector<Case> cases{
      {"w13", DType::fp8_e4m3, {4, 256, 150}, "w13: expected [4, 256, 160] fp8_e4m3, given [4, 256, 150] fp8_e4m3"},
      {"w13", DType::bf16, {4, 256, 160}, "w13: expected [4, 256, 160] fp8_e4m3, given [4, 256, 160] bf16"},
      {"w2", DType::fp8_e4m3, {}, "w2: required"},
      {"w2_scale", DType::f32, {4, 2, 2}, "w2_scale: expected [4, 2, 1] f32, given [4, 2, 2] f32"},
      {"w13_scale", DType::f32, {}, "w13_scale: required by quant fp8-block"},
      {"hidden", DType::f32, {3, 160}, "hidden: expected [3, 160] bf16, given [3, 160] f32"},
      {"hidden", DType::bf16, {}, "hidden: required"},
      {"router_logits", DType::f32, {3, 5}, "router_logits: expected [3, 4] f32|bf16"},
      {"router_logits", DType::f32, {}, "router_logits: required"},
      {"topk_ids", DType::i32, {3, 2}, "topk_weights"},
      {"w13_input_scale", DType::f32, {1}, "w13_input_scale: static input scales need quant fp8-tensor"},
  };
  for (const Case& c : cases) {
    Parts p = valid_parts(rng);
    if (c.shape.empty()) p.tensors.erase(c.tensor);
    else p.tensors[c.tensor] = random_bytes(c.dtype, c.shape, rng);
    p.write(dir.file("l.safetensors"));
    SCOPED_TRACE(c.tensor);
    expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, c.message);
  }
}

// Issue #19: the optional tensors are held to the shapes and dtypes of what they stand for, and
// topk_ids to ids that exist, so a reader can index and compare with them without checking.
TEST(IoLayerFile, OptionalTensorsAreCheckedLikeRequiredOnes) {
  std::mt19937_64 rng(11);
  TempDir dir;
  struct Case {
    const char* tensor;
    DType dtype;
    std::vector<std::int64_t> shape;
    const char* message;
  };
  // The valid parts: T = 3, H = 160, k = 2, E = 4.
  const std::vector<Case> cases{
      {"expected_out", DType::bf16, {2, 160}, "expected_out: expected [3, 160] bf16, given [2, 160] bf16"},
      {"expected_out", DType::bf16, {3, 159}, "expected_out: expected [3, 160] bf16"},
      {"expected_out", DType::bf16, {480}, "expected_out: expected [3, 160] bf16, given [480] bf16"},
      {"expected_out", DType::f32, {3, 160}, "expected_out: expected [3, 160] bf16, given [3, 160] f32"},
      {"expected_topk_ids", DType::i32, {3, 3}, "expected_topk_ids: expected [3, 2] i32, given [3, 3] i32"},
      {"expected_topk_ids", DType::i64, {3, 2}, "expected_topk_ids: expected [3, 2] i32, given [3, 2] i64"},
      {"expected_topk_weights", DType::f32, {0, 2}, "expected_topk_weights: expected [3, 2] f32, given [0, 2] f32"},
      {"expected_topk_weights", DType::bf16, {3, 2}, "expected_topk_weights: expected [3, 2] f32"},
  };
  for (const Case& c : cases) {
    Parts p = valid_parts(rng);
    p.tensors[c.tensor] = random_bytes(c.dtype, c.shape, rng);
    p.write(dir.file("l.safetensors"));
    SCOPED_TRACE(std::string(c.tensor) + " " + c.message);
    expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, c.message);
  }
  for (const std::int32_t id : {4, -2, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()}) {
    Parts p = valid_parts(rng);
    p.tensors.erase("router_logits");
    p.tensors["topk_ids"] = Tensor(DType::i32, {3, 2});
    p.tensors["topk_weights"] = random_bytes(DType::f32, {3, 2}, rng);
    for (std::int64_t x = 0; x < 6; ++x) p.tensors["topk_ids"].ptr<std::int32_t>()[x] = x == 4 ? id : std::int32_t(x % 4);
    p.write(dir.file("l.safetensors"));
    SCOPED_TRACE("topk_ids " + std::to_string(id));
    expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); },
                          "topk_ids: expected ids in [-1, 4), given " + std::to_string(id) + " at flat index 4");
  }
}

TEST(IoLayerFile, BiasMethodsNeedTheBias) {
  std::mt19937_64 rng(6);
  TempDir dir;
  Parts p = valid_parts(rng);
  p.metadata["routing"] = "sigmoid_bias_renorm";
  p.write(dir.file("l.safetensors"));
  expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, "e_score_correction_bias: required");
}

TEST(IoLayerFile, Fp8TensorScalesOfShapeE1AreFlattened) {
  std::mt19937_64 rng(7);
  TempDir dir;
  LayerFile f = make_layer(small_config(QuantScheme::fp8_tensor), 2, false, rng);
  Parts p;
  p.metadata = config_metadata(f.config);
  p.tensors["hidden"] = std::move(f.hidden);
  p.tensors["router_logits"] = std::move(f.router_logits);
  p.tensors["w13"] = std::move(f.w13);
  p.tensors["w2"] = std::move(f.w2);
  p.tensors["w13_scale"] = random_bytes(DType::f32, {4, 1}, rng);
  p.tensors["w2_scale"] = random_bytes(DType::f32, {4}, rng);
  p.write(dir.file("l.safetensors"));
  const LayerFile g = read_layer_file(dir.file("l.safetensors"));
  EXPECT_EQ(g.w13_scale.shape(), std::vector<std::int64_t>{4});
  EXPECT_EQ(std::memcmp(g.w13_scale.view().data, p.tensors["w13_scale"].view().data, 16), 0);
}

// TensorRT-LLM stores w13 as up|gate (w3_w1); the reader turns it into gate|up.
TEST(IoLayerFile, UpGateOrderIsSwappedOnRead) {
  for (QuantScheme quant : {QuantScheme::fp8_block, QuantScheme::fp8_rowwise, QuantScheme::bf16}) {
    SCOPED_TRACE(std::string(to_string(quant)));
    std::mt19937_64 rng(8);
    TempDir dir;
    const LayerFile f = make_layer(small_config(quant), 2, false, rng);
    write_layer_file(dir.file("gate_up.safetensors"), f);
    SafetensorsReader plain(dir.file("gate_up.safetensors"));
    Parts p;
    p.metadata = plain.metadata();
    p.metadata["w13_order"] = "up_gate";
    for (const auto& name : plain.names()) p.tensors[name] = plain.read(name);
    p.write(dir.file("up_gate.safetensors"));
    const LayerFile g = read_layer_file(dir.file("up_gate.safetensors"));

    const std::int64_t e = 4, i = 128, h = 160;
    const std::size_t unit = dtype_size(f.w13.dtype());
    const auto* src = f.w13.ptr<unsigned char>();
    const auto* dst = g.w13.ptr<unsigned char>();
    for (std::int64_t x = 0; x < e; ++x) {
      for (std::int64_t r = 0; r < 2 * i; ++r) {
        const std::int64_t from = (r + i) % (2 * i);  // row r of the result was row r±I in the file
        ASSERT_EQ(std::memcmp(dst + ((x * 2 * i + r) * h) * unit, src + ((x * 2 * i + from) * h) * unit, h * unit), 0)
            << "expert " << x << " row " << r;
      }
    }
    if (quant == QuantScheme::bf16) continue;
    const std::int64_t rows = quant == QuantScheme::fp8_block ? 2 : 2 * i;   // scale rows per expert
    const std::int64_t cols = quant == QuantScheme::fp8_block ? 2 : 1;       // ceil(160/128) or 1
    for (std::int64_t x = 0; x < e; ++x)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t col = 0; col < cols; ++col)
          ASSERT_EQ(g.w13_scale.ptr<std::uint32_t>()[(x * rows + r) * cols + col],
                    f.w13_scale.ptr<std::uint32_t>()[(x * rows + (r + rows / 2) % rows) * cols + col]);
    EXPECT_TRUE(same(f.w2_scale, g.w2_scale));
  }
}

// Shared experts: their count and weight in the metadata, their weights after the routed ones.
TEST(IoLayerFile, SharedExpertsRoundTripAfterTheRoutedOnes) {
  std::mt19937_64 rng(12);
  TempDir dir;
  for (QuantScheme quant : {QuantScheme::fp8_block, QuantScheme::fp8_tensor, QuantScheme::bf16}) {
    SCOPED_TRACE(std::string(to_string(quant)));
    MoEConfig c = small_config(quant);
    c.shared_experts = 2;
    c.shared_expert_weight = 0.5f;
    const LayerFile f = make_layer(c, 3, true, rng);
    write_layer_file(dir.file("shared.safetensors"), f);
    const auto m = SafetensorsReader(dir.file("shared.safetensors")).metadata();
    EXPECT_EQ(m.at("shared_experts"), "2");
    EXPECT_EQ(m.at("shared_expert_weight"), "0.5");
    const LayerFile g = read_layer_file(dir.file("shared.safetensors"));
    EXPECT_EQ(g.config.to_string(), c.to_string());
    EXPECT_EQ(g.w13.size(0), 6);
    EXPECT_TRUE(same(f.w13, g.w13) && same(f.w2, g.w2) && same(f.w13_scale, g.w13_scale) && same(f.w2_scale, g.w2_scale));
  }
  // The routed experts' weights alone do not hold them.
  Parts p = valid_parts(rng);
  p.metadata["shared_experts"] = "1";
  p.write(dir.file("l.safetensors"));
  expect_error_mentions([&] { read_layer_file(dir.file("l.safetensors")); }, "w13: expected [5, 256, 160]");
}

TEST(IoLayerFile, UpGateNeedsAGatedActivation) {
  std::mt19937_64 rng(9);
  TempDir dir;
  MoEConfig c = small_config(QuantScheme::bf16);
  c.activation = Activation::relu2;
  const LayerFile f = make_layer(c, 2, false, rng);
  write_layer_file(dir.file("a.safetensors"), f);
  SafetensorsReader plain(dir.file("a.safetensors"));
  Parts p;
  p.metadata = plain.metadata();
  p.metadata["w13_order"] = "up_gate";
  for (const auto& name : plain.names()) p.tensors[name] = plain.read(name);
  p.write(dir.file("b.safetensors"));
  expect_error_mentions([&] { read_layer_file(dir.file("b.safetensors")); }, "w13_order");
}

TEST(IoLayerFile, WriteRejectsInconsistentLayerAndWritesNothing) {
  std::mt19937_64 rng(10);
  TempDir dir;
  LayerFile f = make_layer(small_config(QuantScheme::fp8_block), 2, false, rng);
  f.w2_scale = Tensor();
  expect_error_mentions([&] { write_layer_file(dir.file("x.safetensors"), f); }, "w2_scale");
  LayerFile g = make_layer(small_config(QuantScheme::bf16), 2, false, rng);
  g.extra["w13"] = random_bytes(DType::u8, {1}, rng);
  expect_error_mentions([&] { write_layer_file(dir.file("x.safetensors"), g); }, "extra 'w13'");
  LayerFile h = make_layer(small_config(QuantScheme::bf16), 2, false, rng);
  h.config.routing.top_k = 9;
  expect_error_mentions([&] { write_layer_file(dir.file("x.safetensors"), h); }, "top_k");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace moekit::io
