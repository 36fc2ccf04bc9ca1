// DESIGN §8 for Layer::forward: each wrong argument throws moekit::Error naming it, and
// nothing is written: out (and the optional routing outputs) keep their poisoned bytes.
// Then backend selection: unknown names are errors, never a silent fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "moekit/backend.h"
#include "scoped_env.h"
#include "validation_util.h"

namespace moekit::test {
namespace {

enum class Entry : std::uint8_t { fused, external };

struct ArgsCase {
  std::string name;
  Entry entry;
  std::function<void(Scene&)> edit;  // edits s.fused or s.external (and s.config if needed)
  std::vector<std::string> words;
};
void PrintTo(const ArgsCase& c, std::ostream* os) { *os << c.name; }

class CoreValidationArgs : public ::testing::TestWithParam<ArgsCase> {};

TEST_P(CoreValidationArgs, ThrowsAndWritesNothing) {
  const ArgsCase& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(QuantScheme::fp8_rowwise, seed);
  c.edit(s);
  Layer layer(s.config, s.weights);
  // Every tensor the call could write, as its bytes before the call.
  const TensorView outputs[] = {s.fused.out, s.fused.topk_ids, s.fused.topk_weights, s.external.out,
                                s.out.view(), s.out_ids.view(), s.out_weights.view()};
  std::vector<std::vector<unsigned char>> before;
  for (const TensorView& t : outputs) before.push_back(bytes_of(t));
  const std::string message = error_of([&] {
    if (c.entry == Entry::fused) layer.forward(s.fused);
    else layer.forward(s.external);
  });
  expect_mentions(message, c.words);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(bytes_of(outputs[i]), before[i]) << "output " << i << " was written";
}

TEST(CoreValidationArgsBase, ValidCallsWork) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(QuantScheme::fp8_rowwise, seed);
  Layer layer(s.config, s.weights);
  EXPECT_EQ(error_of([&] { layer.forward(s.fused); }), "<no error>");
  EXPECT_EQ(error_of([&] { layer.forward(s.external); }), "<no error>");
  // ids of -1 are valid (no expert), and so is E - 1.
  s.ids.ptr<std::int32_t>()[0] = -1;
  s.ids.ptr<std::int32_t>()[1] = 5;
  EXPECT_EQ(error_of([&] { layer.forward(s.external); }), "<no error>");
}

// hidden [5, 160] bf16, logits [5, 6] f32, ids/weights [5, 2], out [5, 160] bf16.
INSTANTIATE_TEST_SUITE_P(
    , CoreValidationArgs,
    ::testing::Values(
        ArgsCase{"fused_hidden_f32", Entry::fused, [](Scene& s) { s.fused.hidden = s.make(DType::f32, {5, 160}); },
                 {"hidden", "bf16", "f32"}},
        ArgsCase{"fused_hidden_wrong_H", Entry::fused, [](Scene& s) { s.fused.hidden = s.make(DType::bf16, {5, 128}); },
                 {"hidden", "[5, 160]", "given [5, 128]"}},
        ArgsCase{"fused_hidden_rank1", Entry::fused, [](Scene& s) { s.fused.hidden = s.make(DType::bf16, {800}); },
                 {"hidden", "given [800]"}},
        ArgsCase{"fused_hidden_absent", Entry::fused, [](Scene& s) { s.fused.hidden = {}; }, {"hidden", "absent"}},
        ArgsCase{"fused_hidden_padded_rows", Entry::fused,
                 [](Scene& s) { s.fused.hidden = padded_rows(s, DType::bf16, 5, 160, 8); }, {"hidden", "contiguous"}},
        ArgsCase{"fused_hidden_on_cuda", Entry::fused, [](Scene& s) { s.fused.hidden.device = Device::cuda; },
                 {"hidden", "cuda"}},
        ArgsCase{"fused_hidden_null_data", Entry::fused, [](Scene& s) { s.fused.hidden.data = nullptr; }, {"hidden", "null"}},
        ArgsCase{"fused_logits_wrong_E", Entry::fused, [](Scene& s) { s.fused.router_logits = s.make(DType::f32, {5, 8}); },
                 {"router_logits", "[5, 6]", "given [5, 8]"}},
        ArgsCase{"fused_logits_wrong_T", Entry::fused, [](Scene& s) { s.fused.router_logits = s.make(DType::f32, {4, 6}); },
                 {"router_logits", "[5, 6]", "given [4, 6]"}},
        ArgsCase{"fused_logits_i32", Entry::fused, [](Scene& s) { s.fused.router_logits = s.make(DType::i32, {5, 6}); },
                 {"router_logits", "f32|bf16", "i32"}},
        ArgsCase{"fused_logits_absent", Entry::fused, [](Scene& s) { s.fused.router_logits = {}; },
                 {"router_logits", "absent"}},
        ArgsCase{"fused_logits_padded_rows", Entry::fused,
                 [](Scene& s) { s.fused.router_logits = padded_rows(s, DType::f32, 5, 6, 2); },
                 {"router_logits", "contiguous"}},
        ArgsCase{"fused_out_wrong_T", Entry::fused, [](Scene& s) { s.fused.out = s.make(DType::bf16, {6, 160}); },
                 {"out", "[5, 160]", "given [6, 160]"}},
        ArgsCase{"fused_out_f32", Entry::fused, [](Scene& s) { s.fused.out = s.make(DType::f32, {5, 160}); },
                 {"out", "bf16", "f32"}},
        ArgsCase{"fused_out_absent", Entry::fused, [](Scene& s) { s.fused.out = {}; }, {"out", "absent"}},
        ArgsCase{"fused_out_transposed", Entry::fused,
                 [](Scene& s) {
                   TensorView v = s.fused.out;
                   v.strides = {1, 5, 0, 0};  // column-major [5, 160]
                   s.fused.out = v;
                 },
                 {"out", "contiguous"}},
        ArgsCase{"fused_only_topk_ids", Entry::fused, [](Scene& s) { s.fused.topk_weights = {}; },
                 {"topk_ids/topk_weights", "both"}},
        ArgsCase{"fused_only_topk_weights", Entry::fused, [](Scene& s) { s.fused.topk_ids = {}; },
                 {"topk_ids/topk_weights", "both"}},
        ArgsCase{"fused_topk_ids_wrong_k", Entry::fused, [](Scene& s) { s.fused.topk_ids = s.make(DType::i32, {5, 3}); },
                 {"topk_ids", "[5, 2]", "given [5, 3]"}},
        ArgsCase{"fused_topk_weights_bf16", Entry::fused,
                 [](Scene& s) { s.fused.topk_weights = s.make(DType::bf16, {5, 2}); }, {"topk_weights", "f32", "bf16"}},
        ArgsCase{"fused_on_external_layer", Entry::fused,
                 [](Scene& s) { s.config.routing.method = RoutingMethod::external; }, {"routing", "external", "ExternalArgs"}},
        ArgsCase{"external_id_E", Entry::external, [](Scene& s) { s.ids.ptr<std::int32_t>()[7] = 6; },
                 {"topk_ids", "[-1, 6)", "given 6", "index 7"}},
        ArgsCase{"external_id_minus2", Entry::external, [](Scene& s) { s.ids.ptr<std::int32_t>()[0] = -2; },
                 {"topk_ids", "[-1, 6)", "given -2"}},
        ArgsCase{"external_ids_i64", Entry::external, [](Scene& s) { s.external.topk_ids = s.make(DType::i64, {5, 2}); },
                 {"topk_ids", "i32", "i64"}},
        ArgsCase{"external_ids_absent", Entry::external, [](Scene& s) { s.external.topk_ids = {}; }, {"topk_ids", "absent"}},
        ArgsCase{"external_ids_padded_rows", Entry::external,
                 [](Scene& s) { s.external.topk_ids = padded_rows(s, DType::i32, 5, 2, 1); }, {"topk_ids", "contiguous"}},
        ArgsCase{"external_weights_wrong_k", Entry::external,
                 [](Scene& s) { s.external.topk_weights = s.make(DType::f32, {5, 3}); },
                 {"topk_weights", "[5, 2]", "given [5, 3]"}},
        ArgsCase{"external_weights_absent", Entry::external, [](Scene& s) { s.external.topk_weights = {}; },
                 {"topk_weights", "absent"}},
        ArgsCase{"external_hidden_wrong_T", Entry::external,
                 [](Scene& s) { s.external.hidden = s.make(DType::bf16, {4, 160}); }, {"topk_ids", "[4, 2]", "given [5, 2]"}},
        ArgsCase{"external_out_wrong_H", Entry::external, [](Scene& s) { s.external.out = s.make(DType::bf16, {5, 144}); },
                 {"out", "[5, 160]", "given [5, 144]"}},
        ArgsCase{"external_out_on_cuda", Entry::external, [](Scene& s) { s.external.out.device = Device::cuda; },
                 {"out", "cuda"}}),
    [](const auto& info) { return info.param.name; });

// ---- Backend selection (DESIGN §6) ----


TEST(CoreBackendSelection, UnknownNameIsAnError) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(QuantScheme::bf16, seed, 1);
  LayerOptions options;
  options.backend = "bogus";
  expect_mentions(error_of([&] { Layer layer(s.config, s.weights, options); }), {"backend", "bogus", "cpu"});
  expect_mentions(error_of([&] { select_backend(s.config, "bogus"); }), {"backend", "bogus"});
}

TEST(CoreBackendSelection, EnvironmentForcesAndIsNeverIgnored) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Scene s = make_scene(QuantScheme::bf16, seed, 1);
  {
    ScopedEnv env("MOEKIT_BACKEND", "bogus");
    expect_mentions(error_of([&] { Layer layer(s.config, s.weights); }), {"backend", "bogus"});
    // A name given by the caller wins over the environment.
    LayerOptions options;
    options.backend = "cpu";
    EXPECT_EQ(error_of([&] { Layer layer(s.config, s.weights, options); }), "<no error>");
  }
  ScopedEnv env("MOEKIT_BACKEND", "cpu");
  Layer layer(s.config, s.weights);
  EXPECT_EQ(layer.backend_name(), "cpu");
  EXPECT_EQ(layer.selection().requested, "cpu");
  EXPECT_EQ(layer.device(), Device::cpu);
}

TEST(CoreBackendSelection, ExplainListsCpuWithYes) {
  const ScopedEnv no_env("MOEKIT_BACKEND", nullptr);
  const MoEConfig config = base_config(QuantScheme::fp8_block);
  const std::vector<std::string> names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  const BackendSelection auto_choice = explain_backends(config);
  EXPECT_EQ(auto_choice.requested, "auto");
  EXPECT_EQ(auto_choice.chosen, "cpu");
  bool cpu_listed = false;
  for (const BackendDecision& d : auto_choice.decisions) cpu_listed = cpu_listed || (d.backend == "cpu" && d.status.is_ok());
  EXPECT_TRUE(cpu_listed);
  expect_mentions(auto_choice.to_string(), {"cpu: yes"});
  // An unknown name: nothing chosen, and the reason lists what exists. No throw.
  const BackendSelection bogus = explain_backends(config, "bogus");
  EXPECT_TRUE(bogus.chosen.empty());
  expect_mentions(bogus.to_string(), {"bogus", "no (", "cpu"});
  EXPECT_EQ(select_backend(config, "cpu").chosen, "cpu");
}

}  // namespace
}  // namespace moekit::test
