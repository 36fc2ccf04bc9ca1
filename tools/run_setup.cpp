#include "run_setup.h"

#include "core/validate.h"
#include "io/presets.h"

namespace moekit::cli {
namespace {

constexpr std::int64_t kMaxTokens = std::int64_t(1) << 24;

// Errors in what the flags ask for are usage errors (exit 2).
template <class F>
auto as_usage(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

MoEConfig apply_overrides(MoEConfig c, const Args& args) {
  if (args.has("quant")) c.quant.scheme = as_usage([&] { return parse_quant_scheme(args.get("quant", ""), "--quant"); });
  const std::string format = args.get("scale-format", "f32");
  if (format != "f32" && format != "ue8m0")
    throw UsageError("--scale-format: expected one of f32|ue8m0, given '" + format + "'");
  c.quant.scale_format = format == "ue8m0" ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  apply_run_options(c, args);  // validates
  return c;
}

void check_backend_name(const Args& args) {
  const std::string name = args.get("backend", "auto");
  std::string known = "auto";
  for (const std::string& b : backend_names()) {
    if (b == name) return;
    known += "|" + b;
  }
  if (name != "auto") throw UsageError("--backend: expected one of " + known + ", given '" + name + "'");
}

RoutingMode routing_mode(const Args& args) {
  const std::string mode = args.get("routing", "fused");
  if (mode != "fused" && mode != "external")
    throw UsageError("--routing: expected one of fused|external, given '" + mode + "'");
  return mode == "fused" ? RoutingMode::fused : RoutingMode::external;
}

// --skew on generated logits: the bias of the config's experts, checked before anything is
// generated (the logits take it once made); the source names it.
void skew_setup(const Args& args, RunSetup& s, std::uint64_t seed) {
  if (!args.has("skew")) return;
  s.skew = skew_of(args);
  s.skew_bias = skew_bias_of(args, s.config.num_experts, seed);
  s.source += ", skew " + s.skew.to_string();
}

void setup_from_file(const Args& args, RunSetup& s, SetupDepth depth) {
  if (args.has("preset") || args.has("tokens") || args.has("seed") || args.has("checkpoint") || args.has("layer"))
    throw UsageError("--inputs: takes the problem from the file; drop --preset/--tokens/--seed/--checkpoint/--layer");
  if (args.has("quant") && args.get("quant", "") != "")
    throw UsageError("--quant: the layer file's weights are already quantized; drop --quant");
  const std::string path = args.get("inputs", "");
  s.source = "file " + path;
  bool has_router_logits = false;
  if (depth == SetupDepth::problem) {
    const io::LayerFileInfo info = io::inspect_layer_file(path);
    s.config = info.config;
    s.tokens = info.tokens;
    has_router_logits = info.has_router_logits;
  } else {
    s.file = io::read_layer_file(path);
    io::LayerFile& f = *s.file;
    s.config = f.config;
    s.tokens = f.hidden.size(0);
    s.hidden = std::move(f.hidden);
    s.router_logits = std::move(f.router_logits);
    s.topk_ids = std::move(f.topk_ids);
    s.topk_weights = std::move(f.topk_weights);
    if (auto it = f.extra.find("expected_out"); it != f.extra.end()) s.expected_out = std::move(it->second);
    s.weights = f.weights();
    has_router_logits = s.router_logits.defined();
  }
  if (args.has("shared-experts") && shared_experts_of(args) != s.config.shared_experts)
    throw UsageError("--shared-experts: the layer file has " + std::to_string(s.config.shared_experts) +
                     " (its weights hold them); drop --shared-experts");
  apply_run_options(s.config, args);
  if (depth == SetupDepth::full) s.master = std::make_unique<core::DequantizedWeights>(s.config, s.weights);
  if (!has_router_logits && s.routing == RoutingMode::fused)
    throw UsageError("--routing fused: the layer file has no router_logits (it carries topk_ids); use --routing external");
}

// Router logits as the model makes them: hidden [T, H] times the gate's weight [E, H]^T, f32.
Tensor router_logits_of(const Tensor& hidden, const Tensor& gate) {
  const std::int64_t tokens = hidden.size(0), h = hidden.size(1), experts = gate.size(0);
  Tensor logits(DType::f32, {tokens, experts});
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t e = 0; e < experts; ++e) {
      float sum = 0.0f;
      for (std::int64_t i = 0; i < h; ++i) sum += bf16_to_float(hidden.ptr<bf16>()[t * h + i]) * gate.ptr<float>()[e * h + i];
      logits.ptr<float>()[t * experts + e] = sum;
    }
  return logits;
}

// T: --tokens, required to run; explain (problem depth) shows the GEMM tiles at 64 without it.
std::int64_t tokens_of(const Args& args, SetupDepth depth) {
  if (depth == SetupDepth::full && !args.has("tokens")) throw UsageError("run: give --tokens N");
  return args.get_int("tokens", 64, 0, kMaxTokens);
}

void setup_from_checkpoint(const Args& args, RunSetup& s, int ep_size, int ep_rank, SetupDepth depth) {
  if (args.has("preset") || args.has("quant"))
    throw UsageError("--checkpoint: takes the problem from the checkpoint; drop --preset/--quant");
  if (!args.has("layer")) throw UsageError("--checkpoint: give --layer N");
  const std::string folder = args.get("checkpoint", "");
  const int layer = int(args.get_int("layer", 0, 0, 100000));
  s.tokens = tokens_of(args, depth);
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));
  s.source = "checkpoint " + folder + ", layer " + std::to_string(layer) + ", seed " + std::to_string(seed);
  const io::ImportOptions options{ep_size, ep_rank, shared_experts_of(args)};
  if (depth == SetupDepth::problem) {
    s.config = io::inspect_hf_layer(folder, layer, options);
    apply_run_options(s.config, args);
    skew_setup(args, s, seed);
    return;
  }
  s.checkpoint = io::import_hf_layer(folder, layer, options);
  s.config = s.checkpoint->config;
  apply_run_options(s.config, args);
  s.weights = s.checkpoint->weights();
  s.master = std::make_unique<core::DequantizedWeights>(s.config, s.weights);
  s.hidden = core::make_hidden(s.tokens, s.config.hidden_size, seed);
  skew_setup(args, s, seed);
  s.router_logits = router_logits_of(s.hidden, s.checkpoint->gate_weight);
  core::add_router_bias(s.router_logits.view(), s.skew_bias);
}

void setup_from_preset(const Args& args, RunSetup& s, int ep_size, int ep_rank, SetupDepth depth) {
  if (!args.has("preset")) throw UsageError("run: give --preset NAME (see `moekit presets`) or --inputs FILE");
  if (args.has("layer")) throw UsageError("--layer: selects a layer of --checkpoint; give --checkpoint DIR");
  const io::Preset& preset = as_usage([&]() -> const io::Preset& { return io::find_preset(args.get("preset", "")); });
  s.tokens = tokens_of(args, depth);
  s.config = apply_overrides(as_usage([&] { return io::with_shared(preset, shared_experts_of(args)); }), args);
  s.config.ep_size = ep_size;
  s.config.ep_rank = ep_rank;
  as_usage([&] {
    validate(s.config);
    return 0;
  });
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));
  s.source = "preset " + args.get("preset", "") + ", seed " + std::to_string(seed);
  skew_setup(args, s, seed);
  if (depth == SetupDepth::problem) return;
  s.synthetic = core::make_synthetic_layer(s.config, seed);
  s.weights = s.synthetic->weights();
  s.master = std::make_unique<core::SyntheticMaster>(s.config, seed);
  s.hidden = core::make_hidden(s.tokens, s.config.hidden_size, seed);
  s.router_logits = core::make_router_logits(s.tokens, s.config.num_experts, DType::f32, seed);
  core::add_router_bias(s.router_logits.view(), s.skew_bias);
}

}  // namespace

std::int64_t shared_experts_of(const Args& args) { return args.get_int("shared-experts", 0, 0, 1 << 16); }

void apply_run_options(MoEConfig& c, const Args& args) {
  if (args.has("fp8-accumulation"))
    c.quant.accumulation =
        as_usage([&] { return parse_fp8_accumulation(args.get("fp8-accumulation", ""), "--fp8-accumulation"); });
  c.batch_invariant = args.has("batch-invariant");
  if (args.has("path"))
    c.experts_path = as_usage([&] { return parse_experts_path(args.get("path", ""), "--path"); });
  as_usage([&] {
    validate(c);
    return 0;
  });
}

Flag accumulation_flag() {
  return {"fp8-accumulation", true,
          "exact|fast|strict: how much of K the CUDA FP8 GEMMs sum in the tensor core before f32. fast (default): "
          "128, as DeepSeek-V3's recipe, DeepGEMM and CUTLASS do (--check: max(1e-2, 0.15 q)); exact: GEMM1 at "
          "most 32 (--check: 5e-3, slower); strict: both GEMMs as f16 WGMMAs on the FP8 values, f32-like sums "
          "(closest to the CPU, slowest; --check: 5e-3). The CPU always sums in f32"};
}

Flag batch_invariance_flag() {
  return {"batch-invariant", false,
          "a token's output the same bits whatever batch it comes in (CUDA: one GEMM tile for every batch "
          "size; fp8-tensor refused)"};
}

Flag path_flag() {
  return {"path", true,
          "auto|staged|min-latency: the experts' kernels on CUDA. auto (default): min-latency (plan, GEMM1 + "
          "activation, GEMM2 + combine; bf16 layers) at a few rows per expert, else staged (permute, GEMM1, "
          "activation, GEMM2, finalize); a forced path that cannot run the layer is refused"};
}

Flag shared_experts_flag() {
  return {"shared-experts", true,
          "N: fuse the model's N shared experts into the layer (SGLang's form: appended to every token's "
          "routing with weight 1; default 0). A preset takes 0 or its model's count (moekit presets), a "
          "checkpoint imports them (mlp.shared_experts), a layer file says its own"};
}

Flag skew_flag() {
  return {"skew", true,
          "none|zipf:ALPHA|hot:N:B: skewed routing, a fixed bias per expert added to the generated router logits "
          "before any routing method sees them. zipf: -ALPHA ln(rank+1); hot: +B on N experts; ranks are a "
          "permutation of the experts drawn from --seed (default none: the logits untouched)"};
}

core::RouterSkew skew_of(const Args& args) {
  if (!args.has("skew")) return {};
  return as_usage([&] { return core::parse_router_skew(args.get("skew", ""), "--skew"); });
}

std::vector<core::RouterSkew> skews_of(const Args& args) {
  std::vector<core::RouterSkew> skews;
  for (const std::string& spec : args.get_list("skew", "none"))
    skews.push_back(as_usage([&] { return core::parse_router_skew(spec, "--skew"); }));
  return skews;
}

std::vector<float> skew_bias_of(const Args& args, std::int64_t experts, std::uint64_t seed) {
  if (!args.has("skew")) return {};
  const core::RouterSkew skew = skew_of(args);
  return as_usage([&] { return core::router_skew_bias(skew, experts, seed, "--skew"); });
}

std::vector<Flag> problem_flags() {
  return {
      {"preset", true, "model preset (moekit presets)"},
      {"tokens", true, "number of tokens T"},
      {"quant", true, "bf16|fp8-tensor|fp8-rowwise|fp8-block (default: the preset's)"},
      {"scale-format", true, "f32|ue8m0: dynamic FP8 scales as any f32 or powers of two"},
      accumulation_flag(),
      batch_invariance_flag(),
      path_flag(),
      {"routing", true, "fused|external: the layer routes, or the caller does (default fused)"},
      {"backend", true, "auto|cpu|... (default auto; MOEKIT_BACKEND overrides auto)"},
      {"seed", true, "seed of the random weights and inputs (default 1)"},
      {"inputs", true, "a layer file (safetensors, DESIGN §2) instead of --preset"},
      {"checkpoint", true, "a Hugging Face checkpoint folder instead of --preset (with --layer)"},
      {"layer", true, "the layer of --checkpoint to import"},
      shared_experts_flag(),
      skew_flag(),
  };
}

RunSetup setup_from_args(const Args& args, int ep_size, int ep_rank, SetupDepth depth) {
  RunSetup s;
  check_backend_name(args);
  s.routing = routing_mode(args);
  if (args.has("skew")) {
    skew_of(args);  // a bad SPEC is named first
    if (s.routing == RoutingMode::external)
      throw UsageError("--skew: biases the router logits the layer routes; with --routing external it is given "
                       "topk_ids/topk_weights instead: drop --skew or use --routing fused");
    if (args.has("inputs"))
      throw UsageError("--skew: biases generated router logits; a layer file's are its own: drop --skew (a skewed "
                       "file: moekit run --preset NAME --skew SPEC --save-layer FILE)");
  }
  if (args.has("inputs") && ep_size > 1)
    throw UsageError("--inputs: a layer file holds every expert; with --ep use --preset or --checkpoint");
  if (args.has("inputs")) setup_from_file(args, s, depth);
  else if (args.has("checkpoint")) setup_from_checkpoint(args, s, ep_size, ep_rank, depth);
  else setup_from_preset(args, s, ep_size, ep_rank, depth);
  return s;
}

}  // namespace moekit::cli
