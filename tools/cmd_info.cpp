// `moekit presets` and `moekit explain`: what moekit knows and what it would choose.
#include <charconv>
#include <system_error>
#include <cstdio>
#include <string>
#include <utility>

#include "commands.h"
#include "moekit/moekit.h"
#include "core/check.h"
#include "core/tuning.h"
#include "core/shared.h"
#include "core/validate.h"
#include "io/presets.h"
#include "run_setup.h"

#ifdef MOEKIT_HAVE_CUDA
#include "cuda/common/device.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/layer/min_latency.h"
#include "cuda/layer/device_weights.h"
#include "cuda/layer/experts.h"
#include "cuda/layer/tactic.h"
#endif

namespace moekit::cli {
namespace {

// What `run --check` will hold this config to (DESIGN §8), and which accumulation that is.
std::string check_rule(const QuantConfig& quant) {
  std::string mode = "bf16";
  if (quant.scheme != QuantScheme::bf16) {
    const bool by_default = quant.accumulation == QuantConfig{}.accumulation;
    mode = std::string(to_string(quant.accumulation)) + " FP8 accumulation" +
           (by_default ? " (the default; --fp8-accumulation exact|strict for closer sums)" : "");
  }
  return "check rule, " + mode + ": " + core::check_rule_text(quant) + "\n";
}

// The GPU whose tuning cache explain looks up: this process's, or --gpu NAME:SMS (what a layer on that
// GPU would read; the CUDA runtime and moekit version stay this build's).
io::TuningDevice tuning_device(const Args& args) {
#ifdef MOEKIT_HAVE_CUDA
  io::TuningDevice d = cuda::this_device();
#else
  io::TuningDevice d{"none", 0, "none", std::string(version())};
#endif
  if (!args.has("gpu")) return d;
  const std::string given = args.get("gpu", "");
  const std::size_t colon = given.rfind(':');
  int sms = 0;
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < given.size();
  if (ok) {
    const char* end = given.data() + given.size();
    const auto [stop, error] = std::from_chars(given.data() + colon + 1, end, sms);
    ok = error == std::errc() && stop == end && sms >= 1 && sms <= 100000;
  }
  if (!ok) throw UsageError("--gpu: expected NAME:SMS, e.g. 'NVIDIA H200:132', given '" + given + "'");
  d.gpu = given.substr(0, colon);
  d.sms = sms;
  return d;
}

#ifdef MOEKIT_HAVE_CUDA
// The tactic of the cuda Experts step at T and in each token bucket up to 16384 (and T's): tuned,
// with the file and time, or the heuristic's, with its reasons; and which cache entries were
// ignored, and why.
// The rows each GEMM of a staged tactic computes at T when the step's T k rows spread evenly over its
// experts (q or q + 1 each): the rows that carry data and the padding the tiles add (the layout pads
// each expert to 16 rows; a tile computes whole row tiles of its own).
void print_computed_rows(const MoEConfig& config, std::int64_t tokens, const cuda::Tactic& tactic) {
  if (tactic.path != cuda::TacticPath::staged || tokens == 0) return;
  const std::int64_t rows = tokens * config.top_k(), experts = config.local_experts();
  const std::int64_t q = rows / experts, more = rows % experts;
  std::printf("  rows computed at T=%lld under even routing (%lld rows over %lld experts):", static_cast<long long>(tokens),
              static_cast<long long>(rows), static_cast<long long>(experts));
  for (const auto& [name, tile] : {std::pair{"GEMM1", tactic.gemm1.tile}, std::pair{"GEMM2", tactic.gemm2.tile}}) {
    const std::int64_t computed =
        more * cuda::computed_rows(tile, q + 1) + (experts - more) * cuda::computed_rows(tile, q);
    std::printf(" %s %lld (%lld padding, %.1f%%)", name, static_cast<long long>(computed),
                static_cast<long long>(computed - rows), computed > 0 ? 100.0 * double(computed - rows) / double(computed) : 0.0);
  }
  std::printf("\n");
}

void print_tactics(const cuda::TacticChooser& chooser, const MoEConfig& config, std::int64_t tokens) {
  for (const std::string& line : chooser.table().report()) std::printf("%s\n", line.c_str());
  std::vector<std::int64_t> buckets;
  for (std::int64_t b = 1; b <= 16384; b *= 2) buckets.push_back(b);
  if (tokens > 16384) buckets.push_back(io::token_bucket(tokens));
  std::printf("cuda experts tactic per token bucket (T in (b/2, b]; T=%lld marked *):\n", static_cast<long long>(tokens));
  for (std::int64_t b : buckets) {
    const cuda::TacticChoice c = chooser.choose({config, b, 0, false});
    std::printf("  %s T<=%-6lld %s: %s\n", io::token_bucket(tokens) == b ? "*" : " ", static_cast<long long>(b),
                c.tactic.name().c_str(), cuda::describe(c, chooser.table().file()).c_str());
  }
}
#endif

}  // namespace

int cmd_presets(int argc, char** argv) {
  const std::vector<Flag> flags{{"help", false, "this text"}};
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("presets", flags).c_str());
    return 0;
  }
  std::printf("%s", io::presets_table().c_str());
  return 0;
}

int cmd_version(int argc, char** argv) {
  const std::vector<Flag> flags{{"help", false, "this text"}};
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("version", flags).c_str());
    return 0;
  }
  std::printf("moekit %s\n", std::string(version()).c_str());
  return 0;
}

int cmd_explain(int argc, char** argv) {
  std::vector<Flag> flags = problem_flags();
  flags.push_back({"tuning-cache", true,
                   "FILE|off: the tuning cache a layer would read (default: MOEKIT_TUNING_CACHE, else the per-user "
                   "file, else the one shipped for this GPU; docs/TUNE.md)"});
  flags.push_back({"gpu", true,
                   "NAME:SMS: look the tuning cache up for this GPU instead of the one here, e.g. 'NVIDIA H200:132'"});
  flags.push_back({"help", false, "this text"});
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("explain", flags).c_str());
    return 0;
  }
  const io::TuningDevice here = tuning_device(args);
  // The problem run would run, from the same flags through the same checks (run_setup.h),
  // reading configs and headers only. With no flag at all: the first preset, whose decisions
  // still show every backend.
  RunSetup s;
  if (args.has("preset") || args.has("inputs") || args.has("checkpoint")) {
    s = setup_from_args(args, 1, 0, SetupDepth::problem);
  } else {
    for (const Flag& f : problem_flags())
      if (f.name != "backend" && args.has(f.name))
        throw UsageError("--" + f.name + ": explain a problem: give --preset NAME, --inputs FILE or --checkpoint DIR");
    s.config = io::presets().front().config;
    s.tokens = 64;
    s.source = "preset " + io::presets().front().name + " (no problem given)";
  }
  const MoEConfig& layer_config = s.config;
  // What a Layer checks at construction: every stage at T = 1 and at this T.
  const BackendSelection selection =
      explain_backends(layer_config, core::weights_layout(layer_config), s.tokens, args.get("backend", "auto"));
#ifdef MOEKIT_HAVE_CUDA
  std::printf("gpu: %s\n", cuda::device_info().to_string().c_str());
#else
  std::printf("gpu: not looked for (built without CUDA)\n");
#endif
  std::printf("problem: %s, T=%lld (%s)\n%s", layer_config.to_string().c_str(), static_cast<long long>(s.tokens),
              s.source.c_str(), selection.to_string().c_str());
  std::printf("%s", check_rule(layer_config.quant).c_str());
  if (layer_config.shared_experts > 0)
    std::printf("shared experts: %lld, fused (core/shared.h): appended to every token's routing with weight %g, they are "
                "local experts %lld.. of every rank: the experts step runs %lld experts, %d slots per token\n",
                static_cast<long long>(layer_config.shared_experts), double(layer_config.shared_expert_weight),
                static_cast<long long>(layer_config.local_experts()), static_cast<long long>(layer_config.weight_experts()),
                int(layer_config.top_k() + layer_config.shared_experts));
  TuningOptions tuning;
  tuning.cache = args.get("tuning-cache", "");
  const core::TuningSource source = core::load_tuning(tuning, here);
#ifdef MOEKIT_HAVE_CUDA
  // The experts' path and the grouped GEMM tiles the cuda backend would pick at T (--tokens,
  // default 64; a file's T): the experts step's problem, which counts the shared experts.
  const MoEConfig config = core::experts_config(layer_config);
  const std::int64_t tokens = s.tokens;
  const cuda::TacticChooser chooser(config, source, here);
  print_tactics(chooser, config, tokens);
  const cuda::TacticChoice at = chooser.choose({config, tokens, 0, false});
  std::printf("cuda experts tactic at T=%lld: %s\n", static_cast<long long>(tokens), at.tactic.to_string().c_str());
  print_computed_rows(config, tokens, at.tactic);
  if (at.tactic.path == cuda::TacticPath::staged && tokens > 0)
    std::printf("  steps after routing: %s\n", cuda::staged_steps(config, tokens, at.tactic).c_str());
  std::printf("the heuristic at T=%lld:\n", static_cast<long long>(tokens));
  cuda::min_latency::Problem fused;
  fused.config = config;
  fused.tokens = tokens;
  const cuda::min_latency::Choice path = cuda::min_latency::choose(fused);
  std::printf("cuda experts at T=%lld: %s\n", static_cast<long long>(tokens), path.reason.c_str());
  if (path.taken) {
    const Status can = cuda::min_latency::can_implement(fused);
    if (!can) std::printf("  refused at the call: %s\n", can.reason().c_str());
    else
      std::printf("  kernels: permutation plan (one block; rows of each expert unpadded: 0 padding rows), "
                  "gemm1_activation (%lld slices of 16 activation columns x one block per <= 32-row entry), "
                  "gemm2_combine (%lld strips of 16 channels, the k slots summed in order); no gather, "
                  "activation or finalize kernel\n",
                  static_cast<long long>(config.intermediate_size / 16), static_cast<long long>(config.hidden_size / 16));
    return selection.chosen.empty() ? 1 : 0;
  }
  const double per_group = double(tokens * config.top_k()) / double(config.num_experts);
  const cuda::GemmKind kind = cuda::gemm_kind(config.quant.scheme);
  const std::int64_t pairs = tokens * config.top_k();
  const cuda::GroupedGemmDesc gemm1{kind, config.local_experts(), config.gemm1_width(), config.hidden_size, 0, pairs};
  const cuda::GroupedGemmDesc gemm2{kind, config.local_experts(), config.hidden_size, config.intermediate_size, 0, pairs};
  struct Gemm {
    const char* name;
    cuda::GroupedGemmDesc desc;
    bool requantized;  // its output is quantized to FP8 next
  };
  // GEMM1 as the heuristic's tactic runs it (a gated layer's decode tile with the activation fused).
  const cuda::Tactic heuristic = cuda::heuristic_tactic({config, tokens, 0, false}).tactic;
  for (const Gemm& g : {Gemm{"GEMM1", gemm1, true}, Gemm{"GEMM2", gemm2, false}}) {
    const auto& [name, desc, requantized] = g;
    cuda::GemmChoice choice =
        cuda::choose_gemm_config(desc, per_group, cuda::gemm_sums(kind, config.quant.accumulation, requantized),
                                 config.batch_invariant);
    if (requantized && heuristic.path == cuda::TacticPath::staged && heuristic.gemm1.tile != choice.config.tile) {
      choice.config = heuristic.gemm1;
      choice.reason += "; the activation and requantization in its epilogue";
    }
    std::printf("cuda %s at T=%lld: %s -> %s (%s)\n", name, static_cast<long long>(tokens), desc.to_string().c_str(),
                choice.config.to_string().c_str(), choice.reason.c_str());
  }
#else
  // Only cuda has tactics: which cache a layer reads, and why no entry applies without CUDA.
  const io::TuningProblem experts_problem = io::TuningProblem::of(core::experts_config(layer_config));
  for (const std::string& line : core::TunedTable(source, here, experts_problem, "experts").report())
    std::printf("%s\n", line.c_str());
  std::printf("cuda experts tactic: heuristic (no CUDA in this build: no tuned entry applies)\n");
#endif
  return selection.chosen.empty() ? 1 : 0;
}

}  // namespace moekit::cli
