// Smoke tests of the moekit command line: what a user types, what comes back.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "core/skew.h"
#include "core/synthetic.h"
#include "io/layer_file.h"
#include "moekit/device.h"
#include "io/safetensors.h"
#include "io/temp_dir.h"
#include "test_util.h"

namespace moekit::test {
namespace {

std::string golden_layer() { return data_path("golden/layer_fp8_block_small.safetensors"); }


TEST(ToolsCli, PresetsListsEveryModel) {
  const Result r = moekit("presets");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* name : {"deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "minimax-m2",
                           "llama4-scout", "gpt-oss-120b"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

TEST(ToolsCli, RunPresetWithCheckPasses) {
  const Result r = moekit("run --preset qwen3-30b-a3b --tokens 3 --check");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("backend  cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantization error vs the ideal reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ncheck: PASS rel_err="), std::string::npos) << r.out;
  // fp8-block with the default (fast) accumulation: max(1e-2, 0.15 q), and every figure named.
  for (const char* figure : {" tol=", " q=", " ideal_ratio=", " (<=1.02) worst_row=", " (<=0.1, token ", " nan=0 inf=0"})
    EXPECT_NE(r.out.substr(r.out.rfind("check:")).find(figure), std::string::npos) << figure << " in\n" << r.out;
  EXPECT_EQ(r.out.substr(r.out.rfind("check:")).find('\n'), r.out.size() - r.out.rfind("check:") - 1)
      << "the check line must be the last line";
}

TEST(ToolsCli, GoldenLayerFileMatchesItsExpectedOutput) {
  const Result r = moekit("run --inputs " + golden_layer() + " --check");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("vs the file's expected_out"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: PASS"), std::string::npos) << r.out;
}

// Issue #19: an expected_out that is not out's [T, H] bf16 is refused by name, never read out of
// bounds or passed vacuously.
struct BadExpectedOut {
  const char* name;
  DType dtype;
  std::vector<std::int64_t> shape;  // the golden file's out is [32, 384]
};

class ToolsCliBadExpectedOut : public ::testing::TestWithParam<BadExpectedOut> {};

// The file as given, past write_layer_file's checks: what a hostile or broken writer makes.
void write_unchecked(const std::string& path, const io::LayerFile& f) {
  std::vector<io::NamedTensor> tensors;
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"hidden", &f.hidden}, {"router_logits", &f.router_logits},
                                {"topk_ids", &f.topk_ids}, {"topk_weights", &f.topk_weights}, {"w13", &f.w13}, {"w2", &f.w2},
                                {"w13_scale", &f.w13_scale}, {"w2_scale", &f.w2_scale},
                                {"e_score_correction_bias", &f.e_score_correction_bias}})
    if (t->defined()) tensors.push_back({name, t->view()});
  for (const auto& [name, t] : f.extra) tensors.push_back({name, t.view()});
  io::write_safetensors(path, tensors, io::config_metadata(f.config));
}

TEST_P(ToolsCliBadExpectedOut, IsAnErrorNamingIt) {
  const BadExpectedOut& c = GetParam();
  TempDir dir;
  io::LayerFile file = io::read_layer_file(golden_layer());
  Tensor bad(c.dtype, c.shape);
  std::memset(bad.view().data, 0, bad.nbytes());  // zeros: a vacuous comparison would pass
  file.extra["expected_out"] = std::move(bad);
  const std::string path = dir.file("bad_expected.safetensors");
  write_unchecked(path, file);
  const Result r = moekit("run --inputs " + path + " --check");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("expected_out: expected [32, 384] bf16"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("check:"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Cases, ToolsCliBadExpectedOut,
                         ::testing::Values(BadExpectedOut{"fewer_rows", DType::bf16, {31, 384}},
                                           BadExpectedOut{"more_rows", DType::bf16, {33, 384}},
                                           BadExpectedOut{"narrower", DType::bf16, {32, 383}},
                                           BadExpectedOut{"empty", DType::bf16, {0, 384}},
                                           BadExpectedOut{"flat", DType::bf16, {32 * 384}},
                                           BadExpectedOut{"f32", DType::f32, {32, 384}}),
                         [](const ::testing::TestParamInfo<BadExpectedOut>& info) { return std::string(info.param.name); });

TEST(ToolsCli, DumpWritesOutAndRoutingAndExternalRoutingAgrees) {
  TempDir dir;
  const Result fused = moekit("run --inputs " + golden_layer() + " --dump " + dir.file("fused.safetensors"));
  ASSERT_EQ(fused.code, 0) << fused.err;
  const Result external =
      moekit("run --inputs " + golden_layer() + " --routing external --dump " + dir.file("external.safetensors"));
  ASSERT_EQ(external.code, 0) << external.err;
  io::SafetensorsReader a(dir.file("fused.safetensors")), b(dir.file("external.safetensors"));
  for (const char* name : {"out", "topk_ids", "topk_weights"}) {
    const Tensor x = a.read(name), y = b.read(name);
    ASSERT_EQ(x.shape(), y.shape()) << name;
    EXPECT_EQ(0, std::memcmp(x.view().data, y.view().data, x.nbytes())) << name;
  }
  EXPECT_EQ(a.read("out").shape(), (std::vector<std::int64_t>{32, 384}));
  EXPECT_EQ(a.metadata().at("num_experts"), "8");
}

TEST(ToolsCli, ExplainPrintsEveryDecision) {
  const Result r = moekit("explain --preset deepseek-v3");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cpu: yes (chosen)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu: "), std::string::npos) << r.out;
#ifdef MOEKIT_HAVE_CUDA
  // The staged path's launches at decode sizes (no GPU here: the heuristic's tactic).
  const Result decode = moekit("explain --preset deepseek-v3 --tokens 1");
  EXPECT_EQ(decode.code, 0) << decode.err;
  EXPECT_NE(decode.out.find("steps after routing: permutation plan + the input's quantization (one launch), GEMM1 "
                            "tokens8_n256_act (rows read by index) + activation + requantization"),
            std::string::npos)
      << decode.out;
  EXPECT_NE(decode.out.find("cuda GEMM1 at T=1: fp8-block groups=256 N=4096 K=7168 max_rows=0 -> 8 rows x (128+128) wgmma"),
            std::string::npos)
      << decode.out;
#endif
  const Result forced = moekit("explain", "MOEKIT_BACKEND=bogus");
  EXPECT_EQ(forced.code, 1);
  EXPECT_NE(forced.out.find("bogus: no (not a backend of this build"), std::string::npos) << forced.out;
}

TEST(ToolsCli, Fp8AccumulationIsFastByDefaultExactOrStrictOnRequestAndNeedsAnFp8Scheme) {
  const Result bad = moekit("run --preset qwen3-30b-a3b --tokens 1 --fp8-accumulation sloppy");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--fp8-accumulation: expected one of exact|fast|strict, given 'sloppy'"), std::string::npos) << bad.err;
  // bf16 layers take the default alone (their GEMMs have no FP8 sums).
  const Result bf16 = moekit("run --preset qwen3-30b-a3b --tokens 1 --quant bf16 --fp8-accumulation exact");
  EXPECT_EQ(bf16.code, 2);
  EXPECT_NE(bf16.err.find("accumulation: exact FP8 accumulation needs an fp8 quant scheme"), std::string::npos) << bf16.err;
  const Result bf16_explained = moekit("explain --preset qwen3-30b-a3b --quant bf16");
  EXPECT_EQ(bf16_explained.code, 0) << bf16_explained.err;
  EXPECT_NE(bf16_explained.out.find("quant=bf16 routing="), std::string::npos) << bf16_explained.out;
  EXPECT_NE(bf16_explained.out.find("check rule, bf16: |out-ref|/|ref| <= 0.005; every token row"), std::string::npos)
      << bf16_explained.out;
  // The default, and the rule it is held to.
  const Result by_default = moekit("explain --preset deepseek-v3");
  EXPECT_EQ(by_default.code, 0) << by_default.err;
  EXPECT_NE(by_default.out.find("quant=fp8-block (fast accumulation)"), std::string::npos) << by_default.out;
  EXPECT_NE(by_default.out.find("check rule, fast FP8 accumulation (the default; --fp8-accumulation exact|strict"),
            std::string::npos)
      << by_default.out;
  EXPECT_NE(by_default.out.find("|out-ref|/|ref| <= max(0.01, 0.15*q); |out-ideal|/|ideal| <= 1.02*q"), std::string::npos)
      << by_default.out;
  const Result strict = moekit("explain --preset deepseek-v3 --fp8-accumulation strict");
  EXPECT_EQ(strict.code, 0) << strict.err;
  EXPECT_NE(strict.out.find("quant=fp8-block (strict accumulation)"), std::string::npos) << strict.out;
  EXPECT_NE(strict.out.find("check rule, strict FP8 accumulation: |out-ref|/|ref| <= 0.005; |out-ideal|/|ideal| <= 1.02*q"),
            std::string::npos)
      << strict.out;
  const Result exact = moekit("explain --preset deepseek-v3 --fp8-accumulation exact");
  EXPECT_EQ(exact.code, 0) << exact.err;
  EXPECT_NE(exact.out.find("quant=fp8-block (exact accumulation)"), std::string::npos) << exact.out;
  EXPECT_NE(exact.out.find("check rule, exact FP8 accumulation: |out-ref|/|ref| <= 0.005;"), std::string::npos) << exact.out;
  // The choice is checked against the quant the flags give, not the preset's (gpt-oss-120b: bf16).
  const Result requantized = moekit("explain --preset gpt-oss-120b --quant fp8-rowwise --fp8-accumulation fast");
  EXPECT_EQ(requantized.code, 0) << requantized.err;
  const Result explained = moekit("explain --preset deepseek-v3 --fp8-accumulation fast");
  EXPECT_EQ(explained.code, 0) << explained.err;
  EXPECT_NE(explained.out.find("quant=fp8-block (fast accumulation)"), std::string::npos) << explained.out;
  // The CPU backend always sums in f32: the choice changes nothing there, but the rule is the mode's.
  const Result cpu = moekit("run --backend cpu --preset qwen3-30b-a3b --tokens 2 --fp8-accumulation exact --check");
  EXPECT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_NE(cpu.out.find("check: PASS rel_err=0.000e+00 tol=5.0e-03 q="), std::string::npos) << cpu.out;
}

TEST(ToolsCli, BatchInvariantRefusesFp8TensorAndIsShown) {
  const Result tensor = moekit("run --preset mixtral-8x7b --tokens 1 --batch-invariant");
  EXPECT_EQ(tensor.code, 2);
  EXPECT_NE(tensor.err.find("batch_invariant: fp8-tensor quantizes the activations with one scale"), std::string::npos)
      << tensor.err;
  const Result explained = moekit("explain --preset deepseek-v3 --tokens 1 --batch-invariant");
  EXPECT_EQ(explained.code, 0) << explained.err;
  EXPECT_NE(explained.out.find(" batch-invariant"), std::string::npos) << explained.out;
#ifdef MOEKIT_HAVE_CUDA
  EXPECT_NE(explained.out.find("batch-invariant: the same tile at every batch size"), std::string::npos) << explained.out;
#endif
  const Result cpu = moekit("run --backend cpu --preset qwen3-30b-a3b --tokens 2 --batch-invariant --check");
  EXPECT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_NE(cpu.out.find("check: PASS"), std::string::npos) << cpu.out;
}

TEST(ToolsCli, BenchOnTheCpuPrintsACaseAndWritesJson) {
  TempDir dir;
  const Result r = moekit("bench --backend cpu --preset qwen3-30b-a3b --tokens 8 --runs 1 --json " + dir.file("b.json"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("qwen3-30b-a3b    fp8-block+fast   T=8"), std::string::npos) << r.out;
  const std::string json = slurp(dir.file("b.json"));
  EXPECT_NE(json.find("\"tokens\": 8"), std::string::npos) << json;
  EXPECT_NE(r.err.find("bench: qwen3-30b-a3b T=8"), std::string::npos) << "progress line on stderr";
}

TEST(ToolsCli, BenchStagesBreakDownTheLayerAndTheJsonSaysWhatRan) {
  TempDir dir;
  const Result r = moekit("bench --backend cpu --preset qwen3-30b-a3b --tokens 4 --runs 1 --stages --json " +
                          dir.file("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* step : {"routing", "quantize", "permute", "gemm1", "activation", "gemm2", "finalize"})
    EXPECT_NE(r.out.find(std::string(step) + " "), std::string::npos) << step << " missing in\n" << r.out;
  const std::string json = slurp(dir.file("b.json"));
  for (const char* key : {"\"git_commit\": \"", "\"moekit_version\"", "\"backend\": \"cpu\"", "\"stages\": {\"routing\": ",
                          "\"gemm2\": ", "\"experts_touched\": "})
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing in\n" << json;
  EXPECT_EQ(json.find("\"git_commit\": \"\""), std::string::npos) << "an empty commit";
}

// The problem written by run --save-layer is the problem: run --inputs reproduces the output
// bit for bit, and bench --inputs times its rows.
TEST(ToolsCli, SaveLayerWritesTheProblemThatRunAndBenchRead) {
  TempDir dir;
  const std::string layer = dir.file("layer.safetensors");
  const Result saved = moekit("run --preset qwen3-30b-a3b --tokens 12 --seed 3 --backend cpu --save-layer " + layer +
                              " --dump " + dir.file("a.safetensors"));
  ASSERT_EQ(saved.code, 0) << saved.err;
  const Result again = moekit("run --inputs " + layer + " --backend cpu --check --dump " + dir.file("b.safetensors"));
  ASSERT_EQ(again.code, 0) << again.err << again.out;
  const io::SafetensorsReader a(dir.file("a.safetensors")), b(dir.file("b.safetensors"));
  const Tensor out_a = a.read("out"), out_b = b.read("out");
  ASSERT_EQ(out_a.nbytes(), out_b.nbytes());
  EXPECT_EQ(std::memcmp(out_a.view().data, out_b.view().data, out_a.nbytes()), 0);

  const Result bench = moekit("bench --backend cpu --runs 1 --inputs " + layer + " --name q3 --tokens 3,12");
  ASSERT_EQ(bench.code, 0) << bench.err;
  EXPECT_NE(bench.out.find("q3               fp8-block+fast   T=3 "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("T=12 "), std::string::npos) << bench.out;
  const Result too_many = moekit("bench --backend cpu --inputs " + layer + " --tokens 13");
  EXPECT_EQ(too_many.code, 2);
  EXPECT_NE(too_many.err.find("--tokens: 13 is more than the file's 12 rows"), std::string::npos) << too_many.err;
}

// The number after `key` in `text` (e.g. "empty=" in the routing line); -1 without it.
long long number_after(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size());
}

// --skew (core/skew.h): the generated logits take the bias before the layer routes them, the
// layer file keeps the biased logits, the same seed gives the same bits, and run prints the load.
TEST(ToolsCli, SkewBiasesTheLogitsTheLayerRoutesAndSaves) {
  TempDir dir;
  const std::string problem = "run --preset qwen3-30b-a3b --tokens 64 --seed 3 --backend cpu";
  const std::string layer = dir.file("skewed.safetensors");
  const Result skewed = moekit(problem + " --skew zipf:3 --save-layer " + layer + " --dump " + dir.file("a.safetensors"));
  ASSERT_EQ(skewed.code, 0) << skewed.err;
  EXPECT_NE(skewed.out.find("moekit run: preset qwen3-30b-a3b, seed 3, skew zipf:3\n"), std::string::npos) << skewed.out;
  // 64 tokens, k = 8 of 128 experts: 4 rows per expert on average, the hot ones in every token.
  const std::size_t line = skewed.out.find("  routing  E=128 rows=512 busiest=");
  ASSERT_NE(line, std::string::npos) << skewed.out;
  const std::string routing = skewed.out.substr(line, skewed.out.find('\n', line) - line);
  EXPECT_GE(number_after(routing, "busiest="), 60) << routing;
  EXPECT_GE(number_after(routing, "empty="), 64) << routing;

  // The file holds the generated logits plus the bias, bit for bit.
  const io::LayerFile file = io::read_layer_file(layer);
  Tensor expected = core::make_router_logits(64, 128, DType::f32, 3);
  core::add_router_bias(expected.view(), core::router_skew_bias(core::parse_router_skew("zipf:3"), 128, 3));
  ASSERT_EQ(file.router_logits.nbytes(), expected.nbytes());
  EXPECT_EQ(std::memcmp(file.router_logits.view().data, expected.view().data, expected.nbytes()), 0);

  // Same seed, same result; the file runs the same layer; without --skew the routing spreads.
  const Result again = moekit(problem + " --skew zipf:3 --dump " + dir.file("b.safetensors"));
  ASSERT_EQ(again.code, 0) << again.err;
  const Result from_file = moekit("run --inputs " + layer + " --backend cpu --dump " + dir.file("c.safetensors"));
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  const Result plain = moekit(problem + " --dump " + dir.file("d.safetensors"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("skew"), std::string::npos) << plain.out;
  const std::size_t plain_line = plain.out.find("  routing  E=128 rows=512 busiest=");
  ASSERT_NE(plain_line, std::string::npos) << plain.out;
  EXPECT_LT(number_after(plain.out.substr(plain_line), "busiest="), 32) << plain.out;
  EXPECT_LT(number_after(plain.out.substr(plain_line), "empty="), 16) << plain.out;
  const io::SafetensorsReader a(dir.file("a.safetensors")), b(dir.file("b.safetensors")), c(dir.file("c.safetensors")),
      d(dir.file("d.safetensors"));
  for (const char* name : {"out", "topk_ids", "topk_weights"}) {
    const Tensor x = a.read(name), y = b.read(name), z = c.read(name), w = d.read(name);
    ASSERT_EQ(x.nbytes(), y.nbytes());
    EXPECT_EQ(std::memcmp(x.view().data, y.view().data, x.nbytes()), 0) << name << ": same seed, other bits";
    EXPECT_EQ(std::memcmp(x.view().data, z.view().data, x.nbytes()), 0) << name << ": the saved layer differs";
    EXPECT_NE(std::memcmp(x.view().data, w.view().data, x.nbytes()), 0) << name << ": the skew changed nothing";
  }
}

// bench --skew: the same bias on every input set; each case's routing line and the JSON say the load.
TEST(ToolsCli, BenchSkewShowsTheLoadOfEachCase) {
  TempDir dir;
  const Result r = moekit("bench --backend cpu --preset qwen3-30b-a3b --tokens 64 --runs 1 --skew hot:8:12 --json " +
                          dir.file("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  // +12 on 8 experts: every token's top 8 are those 8 (the generator's logits lie within +-5.9).
  EXPECT_NE(r.out.find("    routing: E=128 rows=512 busiest=64 (expert "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("empty=120, skew hot:8:12\n"), std::string::npos) << r.out;
  const std::string json = slurp(dir.file("b.json"));
  EXPECT_NE(json.find("\"skew\": \"hot:8:12\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"busiest_rows\": 64, \"empty_experts\": 120"), std::string::npos) << json;
}

// A refused --skew writes nothing.
TEST(ToolsCli, BadSkewWritesNothing) {
  TempDir dir;
  for (const char* skew : {"zipf:x", "hot:129:1"}) {
    const Result r = moekit(std::string("run --preset qwen3-30b-a3b --tokens 4 --backend cpu --skew ") + skew +
                            " --save-layer " + dir.file("l.safetensors") + " --dump " + dir.file("d.safetensors"));
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("--skew: "), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("l.safetensors"))) << skew;
    EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors"))) << skew;
  }
}

// A layer with a shared expert, as a file (DeepSeek-V3's routing, small): run --check, explain and
// bench take it; the bench also times its two parts apart.
TEST(ToolsCli, SharedExpertLayerFileRunsChecksAndBenches) {
  TempDir dir;
  MoEConfig c;
  c.num_experts = 8, c.hidden_size = 256, c.intermediate_size = 128;
  c.routing.method = RoutingMethod::sigmoid_bias_grouped;
  c.routing.top_k = 2, c.routing.n_group = 4, c.routing.topk_group = 2, c.routing.routed_scaling_factor = 2.5f;
  c.quant.scheme = QuantScheme::fp8_block;
  c.shared_experts = 1;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const core::SyntheticLayer layer = core::make_synthetic_layer(c, seed);
  const Tensor hidden = core::make_hidden(6, c.hidden_size, seed);
  const Tensor logits = core::make_router_logits(6, c.num_experts, DType::f32, seed);
  const std::string path = dir.file("shared.safetensors");
  io::write_layer_file(path, io::LayerViews{c, hidden.view(), logits.view(), {}, {}, layer.weights()});
  for (const char* routing : {"fused", "external"}) {
    const Result r = moekit("run --backend cpu --inputs " + path + " --routing " + routing + " --check");
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("shared_experts=1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("w13 [9, 256, 256]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\ncheck: PASS rel_err=0.000e+00"), std::string::npos) << r.out;
  }
  const Result explain = moekit("explain --inputs " + path);
  EXPECT_EQ(explain.code, 0) << explain.err;
  EXPECT_NE(explain.out.find("shared_experts=1"), std::string::npos) << explain.out;
  const Result bench = moekit("bench --backend cpu --runs 1 --inputs " + path + " --tokens 2,6");
  ASSERT_EQ(bench.code, 0) << bench.err;
  EXPECT_NE(bench.out.find("apart: routed "), std::string::npos) << bench.out;
}

struct BadCase {
  const char* name;
  const char* arguments;
  const char* message;  // a part of the one stderr line
};

class ToolsCliBadArguments : public ::testing::TestWithParam<BadCase> {};

TEST_P(ToolsCliBadArguments, OneLineOnStderrAndExitTwo) {
  const BadCase& c = GetParam();
  const Result r = moekit(c.arguments);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("check:"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ToolsCliBadArguments,
    ::testing::Values(BadCase{"no_command", "", "usage: moekit"},
                      BadCase{"unknown_command", "frobnicate", "unknown command 'frobnicate'"},
                      BadCase{"unknown_flag", "run --preset qwen3-30b-a3b --tokens 1 --fast", "unknown flag --fast"},
                      BadCase{"missing_value", "run --preset qwen3-30b-a3b --tokens", "--tokens needs a value"},
                      BadCase{"bad_tokens", "run --preset qwen3-30b-a3b --tokens -1", "--tokens: expected an integer"},
                      BadCase{"tokens_not_a_number", "run --preset qwen3-30b-a3b --tokens 8x", "--tokens"},
                      BadCase{"unknown_preset", "run --preset gpt-5 --tokens 1", "preset: expected one of"},
                      BadCase{"bad_quant", "run --preset qwen3-30b-a3b --tokens 1 --quant fp4", "--quant: expected one of"},
                      BadCase{"quant_shapes_disallow", "run --preset gpt-oss-120b --tokens 1 --quant fp8-block",
                              "intermediate_size: fp8-block needs a multiple of 128"},
                      BadCase{"bad_routing_mode", "run --preset qwen3-30b-a3b --tokens 1 --routing magic", "--routing"},
                      BadCase{"bad_backend", "run --preset qwen3-30b-a3b --tokens 1 --backend tpu", "--backend: expected one of"},
                      BadCase{"no_problem", "run --tokens 1", "--preset"},
                      BadCase{"no_tokens", "run --preset qwen3-30b-a3b", "--tokens"},
                      BadCase{"repeated_flag", "run --preset qwen3-30b-a3b --preset deepseek-v3 --tokens 1", "given twice"},
                      BadCase{"inputs_and_preset", "run --inputs x.safetensors --preset qwen3-30b-a3b", "--inputs"},
                      BadCase{"checkpoint_without_layer", "run --checkpoint /nonexistent --tokens 1", "--layer"},
                      BadCase{"bench_without_preset", "bench --tokens 1", "--preset"},
                      BadCase{"bench_bad_tokens", "bench --preset qwen3-30b-a3b --tokens 0", "--tokens"},
                      BadCase{"bench_bad_graph", "bench --preset qwen3-30b-a3b --graph maybe", "--graph"},
                      BadCase{"bench_inputs_and_preset", "bench --inputs x.safetensors --preset qwen3-30b-a3b", "--inputs"},
                      BadCase{"bench_name_without_inputs", "bench --preset qwen3-30b-a3b --name x", "--name"},
                      BadCase{"bench_ep_without_mpirun", "bench --ep 2 --preset qwen3-30b-a3b", "--ep 2"},
                      BadCase{"bench_ep_combine_without_ep", "bench --preset qwen3-30b-a3b --ep-combine exact", "--ep-combine"},
                      BadCase{"run_save_layer_with_ep", "run --preset qwen3-30b-a3b --ep 2 --save-layer x", "--save-layer"},
                      // Issue #19: lists with empty items lost them silently.
                      BadCase{"bench_tokens_empty_item", "bench --preset qwen3-30b-a3b --tokens 1,,2",
                              "--tokens: expected a comma-separated list without empty items, given '1,,2'"},
                      BadCase{"bench_tokens_trailing_comma", "bench --preset qwen3-30b-a3b --tokens 1,2,", "--tokens"},
                      BadCase{"bench_tokens_leading_comma", "bench --preset qwen3-30b-a3b --tokens ,8", "--tokens"},
                      BadCase{"bench_tokens_empty", "bench --preset qwen3-30b-a3b --tokens ''", "--tokens"},
                      BadCase{"bench_tokens_not_a_number", "bench --preset qwen3-30b-a3b --tokens 1,x", "given 'x' in '1,x'"},
                      BadCase{"bench_tokens_plus", "bench --preset qwen3-30b-a3b --tokens +4", "--tokens"},
                      BadCase{"bench_presets_empty_item", "bench --preset qwen3-30b-a3b,,deepseek-v3 --tokens 1", "--preset"},
                      BadCase{"run_tokens_space", "run --preset qwen3-30b-a3b --tokens ' 4'", "--tokens"},
                      BadCase{"run_layer_without_checkpoint", "run --preset qwen3-30b-a3b --tokens 1 --layer 3", "--layer"},
                      // explain takes run's flags and checks (issue #19: it ignored some and explained another problem).
                      BadCase{"explain_flag_without_problem", "explain --quant bf16", "--quant: explain a problem"},
                      BadCase{"explain_checkpoint_without_layer", "explain --checkpoint /nonexistent", "--layer"},
                      BadCase{"explain_inputs_and_quant", "explain --inputs x.safetensors --quant bf16", "--quant"},
                      BadCase{"explain_unknown_preset", "explain --preset gpt-5", "preset: expected one of"},
                      BadCase{"fuzz_replay_with_cases", "fuzz --replay 5 --cases 3", "--replay: runs one case; drop --cases"},
                      BadCase{"fuzz_bad_backend", "fuzz --backend tpu", "--backend: expected one of"},
                      BadCase{"fuzz_bad_seed", "fuzz --seed -1", "--seed: expected an integer"},
                      BadCase{"tune_no_problem", "tune", "give --preset NAME"},
                      BadCase{"tune_tokens_not_buckets", "tune --preset qwen3-30b-a3b --tokens 1,3",
                              "--tokens: expected powers of two (token buckets), given 3"},
                      BadCase{"tune_cache_without_verify", "tune --preset qwen3-30b-a3b --cache x.json",
                              "--cache: names the cache --verify checks"},
                      BadCase{"tune_few_runs", "tune --preset qwen3-30b-a3b --runs 5", "--runs: expected an integer in [20"},
                      BadCase{"tune_inputs_and_preset", "tune --inputs x.safetensors --preset qwen3-30b-a3b", "--inputs"},
                      // Shared experts: a preset takes its model's, a layer file says its own.
                      BadCase{"shared_experts_model_has_none", "run --preset qwen3-30b-a3b --tokens 1 --shared-experts 1",
                              "shared_experts: qwen3-30b-a3b has 0 shared experts"},
                      BadCase{"shared_experts_more_than_the_model", "explain --preset deepseek-v3 --shared-experts 2",
                              "expected 0 or 1, given 2"},
                      BadCase{"shared_experts_weight_on_input", "run --preset llama4-scout --tokens 1 --shared-experts 1",
                              "shared_experts: the routing weights go on the input"},
                      BadCase{"shared_experts_of_a_file", "run --inputs " MOEKIT_TEST_DATA
                              "/golden/layer_fp8_block_small.safetensors --shared-experts 1",
                              "--shared-experts: the layer file has 0"},
                      BadCase{"bench_shared_experts_model_has_none", "bench --preset mixtral-8x7b --shared-experts 1",
                              "shared_experts: mixtral-8x7b has 0"},
                      BadCase{"bench_shared_experts_bad", "bench --preset deepseek-v3 --shared-experts -1",
                              "--shared-experts"},
                      // --skew: the spec's grammar, named; not where nothing is generated or routed.
                      BadCase{"skew_unknown", "run --preset qwen3-30b-a3b --tokens 1 --skew uniform",
                              "--skew: expected none, zipf:ALPHA (ALPHA in [0, 100]) or hot:N:B"},
                      BadCase{"skew_bad_alpha", "run --preset qwen3-30b-a3b --tokens 1 --skew zipf:x",
                              "--skew: bad ALPHA: expected none, zipf:ALPHA"},
                      BadCase{"skew_negative_alpha", "run --preset qwen3-30b-a3b --tokens 1 --skew zipf:-1",
                              "given 'zipf:-1'"},
                      BadCase{"skew_hot_without_bias", "run --preset qwen3-30b-a3b --tokens 1 --skew hot:8",
                              "--skew: hot takes N and B"},
                      BadCase{"skew_hot_more_than_experts", "run --preset qwen3-30b-a3b --tokens 1 --skew hot:129:2",
                              "--skew: hot:129:... biases more experts than the layer's 128"},
                      BadCase{"skew_external_routing", "run --preset qwen3-30b-a3b --tokens 1 --routing external --skew zipf:1",
                              "--skew: biases the router logits the layer routes; with --routing external"},
                      BadCase{"skew_layer_file", "run --inputs " MOEKIT_TEST_DATA
                              "/golden/layer_fp8_block_small.safetensors --skew zipf:1",
                              "--skew: biases generated router logits; a layer file's are its own"},
                      BadCase{"bench_skew_bad", "bench --preset qwen3-30b-a3b --skew hot:0:1", "--skew: bad N"},
                      BadCase{"bench_skew_external_routing", "bench --preset qwen3-30b-a3b --routing external --skew zipf:1",
                              "--skew: biases the router logits the layer routes; with --routing external"},
                      BadCase{"bench_skew_layer_file", "bench --inputs x.safetensors --skew zipf:1",
                              "--skew: biases generated router logits"},
                      BadCase{"explain_skew_without_problem", "explain --skew zipf:1", "--skew: explain a problem"},
                      BadCase{"explain_skew_hot_more_than_experts", "explain --preset deepseek-v3 --skew hot:257:1",
                              "expected N in [1, 256]"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// Issue #19: -h and <command> --help were refused.
TEST(ToolsCli, EveryCommandTakesHelp) {
  for (const char* command : {"run", "presets", "explain", "bench", "tune", "fuzz", "version"})
    for (const char* flag : {"-h", "--help"}) {
      const Result r = moekit(std::string(command) + " " + flag);
      EXPECT_EQ(r.code, 0) << command << " " << flag << ": " << r.err;
      EXPECT_EQ(r.out.rfind(std::string("usage: moekit ") + command, 0), 0u) << r.out;
      EXPECT_TRUE(r.err.empty()) << r.err;
    }
  for (const char* flag : {"-h", "--help", "help"}) {
    const Result r = moekit(flag);
    EXPECT_EQ(r.code, 0) << flag;
    EXPECT_NE(r.out.find("usage: moekit <command>"), std::string::npos) << r.out;
  }
}

// A checkpoint folder whose weights are holes of a sparse file: 8 experts of [4096, 8192] bf16
// (1.5 GB that is never written), read or not. Layer 1; the router and nothing else dense.
void write_sparse_checkpoint(const TempDir& dir) {
  const std::int64_t e = 8, h = 4096, i = 8192;
  std::ofstream(dir.file("config.json"))
      << R"({"model_type":"qwen3_moe","hidden_size":4096,"moe_intermediate_size":8192,"num_experts":8,)"
      << R"("num_experts_per_tok":2,"norm_topk_prob":true,"num_hidden_layers":2})";
  std::string header = "{";
  std::uint64_t offset = 0;
  auto add = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    const std::uint64_t bytes = std::uint64_t(rows * cols) * 2;
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"BF16\",\"shape\":[" +
              std::to_string(rows) + "," + std::to_string(cols) + "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  };
  add("model.layers.1.mlp.gate.weight", e, h);
  for (std::int64_t x = 0; x < e; ++x) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(x) + ".";
    add(p + "gate_proj.weight", i, h);
    add(p + "up_proj.weight", i, h);
    add(p + "down_proj.weight", h, i);
  }
  header += "}";
  const std::uint64_t length = header.size();
  {
    std::ofstream out(dir.file("model.safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
  }
  std::filesystem::resize_file(dir.file("model.safetensors"), 8 + length + offset);
}

// Issue #19: explain ignored --checkpoint, --layer and --quant and explained another problem.
// It now builds the problem from run's flags and checks, reading configs and headers only.
TEST(ToolsCli, ExplainExplainsTheProblemRunWouldRun) {
  const Result quant = moekit("explain --preset qwen3-30b-a3b --quant bf16 --tokens 5");
  EXPECT_EQ(quant.code, 0) << quant.err;
  EXPECT_NE(quant.out.find("problem: E=128 k=8 H=2048 I=768 activation=silu_and_mul quant=bf16 "), std::string::npos)
      << quant.out;
  EXPECT_NE(quant.out.find("T=5 (preset qwen3-30b-a3b, seed 1)"), std::string::npos) << quant.out;

  const Result file = moekit("explain --inputs " + golden_layer());
  EXPECT_EQ(file.code, 0) << file.err;
  EXPECT_NE(file.out.find("problem: E=8 k=2 H=384 I=256 "), std::string::npos) << file.out;
  EXPECT_NE(file.out.find("T=32 (file "), std::string::npos) << file.out;

  TempDir dir;
  write_sparse_checkpoint(dir);
  const std::string checkpoint = "--checkpoint " + dir.path().string() + " --layer 1";
  const Result imported = moekit("explain " + checkpoint + " --tokens 3");
  EXPECT_EQ(imported.code, 0) << imported.err;
  EXPECT_NE(imported.out.find("problem: E=8 k=2 H=4096 I=8192 activation=silu_and_mul quant=bf16 "), std::string::npos)
      << imported.out;
  EXPECT_NE(imported.out.find("T=3 (checkpoint "), std::string::npos) << imported.out;
  EXPECT_EQ(moekit("explain " + checkpoint + " --layer 0").code, 2);  // the flags run refuses, refused
  const Result dense = moekit("explain --checkpoint " + dir.path().string() + " --layer 0");
  EXPECT_EQ(dense.code, 1);
  EXPECT_NE(dense.err.find("layer 0 has no MoE router"), std::string::npos) << dense.err;
#if !defined(__SANITIZE_ADDRESS__)
  // Under 1 GB of address space: explain needs none of the 1.5 GB of weights, run needs them all.
  const Result limited = moekit("explain " + checkpoint, "ulimit -v 1000000;");
  EXPECT_EQ(limited.code, 0) << limited.err;
  const Result run = moekit("run " + checkpoint + " --tokens 1", "ulimit -v 1000000;");
  EXPECT_EQ(run.code, 1) << run.err;
  EXPECT_NE(run.err.find("cannot allocate"), std::string::npos) << run.err;
#endif
}

// Issue #19: a non-number was ignored, a huge count aborted in thread creation.
TEST(ToolsCli, BadNumThreadsIsOneLineNamingIt) {
  for (const char* value : {"''", "four", "0", "-3", "100000000", "8threads"}) {
    const Result r = moekit("run --preset qwen3-30b-a3b --tokens 2 --backend cpu", std::string("MOEKIT_NUM_THREADS=") + value);
    EXPECT_EQ(r.code, 1) << value << "\n" << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("MOEKIT_NUM_THREADS: expected an integer in [1, 1024]"), std::string::npos) << r.err;
  }
  const Result ok = moekit("run --preset qwen3-30b-a3b --tokens 2 --backend cpu", "MOEKIT_NUM_THREADS=2");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// The differential campaign: a line per case with its seed, the same case again from that seed,
// and a JSON summary.
TEST(ToolsCli, FuzzPrintsEachCaseItsSeedReplaysAndWritesJson) {
  TempDir dir;
  const Result r = moekit("fuzz --backend cpu --cases 6 --seed 3 --json " + dir.file("fuzz.json"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\nfuzz: PASS 6 cases, 0 failed\n"), std::string::npos) << r.out;
  const std::size_t at = r.out.find("case 4 seed=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string seed = r.out.substr(at + 12, r.out.find(' ', at + 12) - at - 12);
  const std::string problem = r.out.substr(r.out.find(" | ", at), r.out.find('\n', at) - r.out.find(" | ", at));
  const Result again = moekit("fuzz --backend cpu --replay " + seed);
  EXPECT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find(problem), std::string::npos) << "replay of " << seed << " must draw the same case:\n"
                                                       << problem << "\n" << again.out;
  const std::string json = slurp(dir.file("fuzz.json"));
  for (const char* key : {"\"cases_run\": 6", "\"failed\": 0", "\"seed\": 3", "\"modes\": {"})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
}

TEST(ToolsCli, UnreadableLayerFileIsAnErrorNotACrash) {
  TempDir dir;
  write_bytes(dir.file("bad.safetensors"), "\x10\x00\x00\x00\x00\x00\x00\x00{not json}");
  const Result r = moekit("run --inputs " + dir.file("bad.safetensors"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("bad.safetensors"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moekit::test
