// `moekit run`: one forward pass of a preset or a layer file, optionally checked against
// the pipeline and ideal references (DESIGN §8's rule, core/check.h).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "commands.h"
#include "core/check.h"
#include "core/shared.h"
#include "cpu/reference.h"
#include "io/layer_file.h"
#include "io/safetensors.h"
#include "moekit/device.h"
#include "run_setup.h"

#ifdef MOEKIT_HAVE_CUDA
#include "cuda/layer/tactic.h"
#endif

namespace moekit::cli {
namespace {

std::string shape(const Tensor& t) { return t.view().to_string(); }

void print_header(const RunSetup& s, const Layer& layer, [[maybe_unused]] const TuningOptions& tuning) {
  const double gb = double(s.weights.w13.nbytes() + s.weights.w2.nbytes()) / 1e9;
  std::printf("moekit run: %s\n", s.source.c_str());
  std::printf("  config   %s\n", s.config.to_string().c_str());
  std::printf("  hidden   %s, routing %s\n", shape(s.hidden).c_str(),
              s.routing == RoutingMode::fused ? "fused" : "external");
  std::printf("  weights  w13 %s, w2 %s (%.2f GB)\n", s.weights.w13.to_string().c_str(),
              s.weights.w2.to_string().c_str(), gb);
  std::printf("  backend  %s\n", std::string(layer.backend_name()).c_str());
#ifdef MOEKIT_HAVE_CUDA
  // The experts step's tactic at this T, from the cache the layer reads (or the heuristic), and why.
  if (layer.backend_name() == "cuda") {
    const MoEConfig experts = core::experts_config(s.config);
    const cuda::TacticChooser chooser(experts, &tuning);
    const cuda::TacticChoice at = chooser.choose({experts, s.hidden.size(0), 0, false});
    std::printf("  tactic   %s: %s\n", at.tactic.name().c_str(), cuda::describe(at, chooser.table().file()).c_str());
  }
#endif
}

// The routing an external-routing run passes in: the file's, or the CPU router's.
void external_routing(const RunSetup& s, const Tensor& ids, const Tensor& weights) {
  if (s.topk_ids.defined()) {
    std::memcpy(ids.view().data, s.topk_ids.view().data, ids.nbytes());
    std::memcpy(weights.view().data, s.topk_weights.view().data, weights.nbytes());
    return;
  }
  route(s.config.routing, {s.router_logits.view(), s.config.routing.uses_bias() ? s.weights.e_score_correction_bias : TensorView{}},
        {ids.view(), weights.view()});
}

// The verdict of the last line: the pipeline check's, and expected_out when the file's failed.
std::string verdict(const core::CheckResult& pipeline, bool file_pass) {
  if (file_pass) return pipeline.verdict();
  std::string failed;
  for (core::CheckRule rule : pipeline.failed) failed += std::string(core::to_string(rule)) + ", ";
  return "FAIL [" + failed + "expected_out]";
}

// DESIGN §8's check against the pipeline and ideal references, and against the file's
// expected_out (held to the same rule, as a second pipeline reference) when it has one.
bool check(const RunSetup& s, const Tensor& out, const Tensor& ids, const Tensor& weights) {
  const cpu::ReferenceInputs in{s.config, s.weights, s.hidden.view(), ids.view(), weights.view()};
  Tensor pipeline(DType::bf16, out.shape());
  cpu::pipeline_reference(in, pipeline.view());
  const std::vector<double> ideal = cpu::ideal_reference(in, *s.master);
  const core::CheckResult r = core::check_output({out.view(), pipeline.view(), ideal, s.config.quant});
  std::printf("  quantization error vs the ideal reference (f64, %s weights): pipeline reference q=%.3e, "
              "out %.3e (ratio %.4f)\n",
              s.synthetic ? "unquantized" : "dequantized", r.q, r.rel_err_ideal, r.ideal_ratio);
  std::printf("  vs the pipeline reference: max |out - ref| = %.3e (max |ref| = %.3e)\n", r.max_abs_err, r.max_abs_ref);
  std::printf("  rule (DESIGN §8): %s\n", core::check_rule_text(s.config.quant).c_str());
  bool file_pass = true;
  if (s.expected_out.defined()) {
    const core::CheckResult f = core::check_output({out.view(), s.expected_out.view(), ideal, s.config.quant});
    std::printf("  vs the file's expected_out: %s\n", f.to_string().c_str());
    file_pass = f.pass();
  }
  std::printf("check: %s %s\n", verdict(r, file_pass).c_str(), r.figures().c_str());
  return r.pass() && file_pass;
}

void dump(const std::string& path, const RunSetup& s, const Tensor& out, const Tensor& ids, const Tensor& weights) {
  io::write_safetensors(path, {{"out", out.view()}, {"topk_ids", ids.view()}, {"topk_weights", weights.view()}},
                        io::config_metadata(s.config));
  std::printf("  dumped   out, topk_ids, topk_weights to %s\n", path.c_str());
}

// The problem as a layer file (DESIGN §2): what anyone needs to run it elsewhere.
void save_layer(const std::string& path, const RunSetup& s, const Tensor& ids, const Tensor& weights) {
  const bool external = s.routing == RoutingMode::external;
  io::write_layer_file(path, io::LayerViews{s.config, s.hidden.view(), external ? TensorView{} : s.router_logits.view(),
                                            external ? ids.view() : TensorView{}, external ? weights.view() : TensorView{},
                                            s.weights});
  std::printf("  saved    the layer and its inputs to %s\n", path.c_str());
}

}  // namespace

int cmd_run(int argc, char** argv) {
  std::vector<Flag> flags = problem_flags();
  flags.push_back({"check", false,
                   "compare with the CPU pipeline and ideal references under DESIGN §8's rule for the config "
                   "(`moekit explain` prints it); last line check: PASS|FAIL"});
  flags.push_back({"dump", true, "write out, topk_ids, topk_weights to this safetensors file"});
  flags.push_back({"save-layer", true, "write the problem (config, weights, inputs) as a layer file (DESIGN §2)"});
  flags.push_back({"ep", true, "expert parallelism over N MPI ranks: mpirun -np N moekit run --ep N ..."});
  flags.push_back({"ep-combine", true, "auto|exact|partial: how expert rows return (auto: exact on cpu)"});
  flags.push_back({"ep-capacity", true, "fixed-capacity EP: at most N tokens per rank, no count exchange"});
  flags.push_back({"ep-profile", false, "EP step times: barriers before the exchanges, each step waits for its kernels"});
  flags.push_back({"comm-timeout", true, "seconds a collective waits for the other ranks (default 120)"});
  flags.push_back({"help", false, "this text"});
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("run", flags).c_str());
    return 0;
  }
  if (args.get_int("ep", 1, 1, 1 << 16) > 1) return cmd_run_ep(args);
  for (const char* flag : {"ep-combine", "ep-capacity", "ep-profile", "comm-timeout"})
    if (args.has(flag)) throw UsageError(std::string("--") + flag + ": needs --ep N with N > 1");
  const RunSetup s = setup_from_args(args);
  LayerOptions options;
  options.backend = args.get("backend", "auto");
  options.max_tokens = s.hidden.size(0);
  Layer layer(s.config, s.weights, options);
  print_header(s, layer, options.tuning);

  const std::int64_t tokens = s.hidden.size(0);
  Tensor out(DType::bf16, {tokens, s.config.hidden_size});
  Tensor ids(DType::i32, {tokens, s.config.top_k()});
  Tensor weights(DType::f32, {tokens, s.config.top_k()});
  std::memset(out.view().data, 0xff, out.nbytes());  // NaN: an unwritten element cannot pass
  if (s.routing == RoutingMode::external) external_routing(s, ids, weights);
  if (args.has("save-layer")) save_layer(args.get("save-layer", ""), s, ids, weights);

  // The layer's tensors live on its device: copies in, the forward pass, copies out.
  const Device device = layer.device();
  auto on_device = [&](const Tensor& host) {
    DeviceTensor t(host.dtype(), host.shape(), device);
    t.copy_from(host.view());
    return t;
  };
  DeviceTensor d_hidden = on_device(s.hidden), d_out = on_device(out), d_ids = on_device(ids), d_weights = on_device(weights);
  std::optional<DeviceTensor> d_logits;
  if (s.router_logits.defined()) d_logits.emplace(on_device(s.router_logits));
  auto forward = [&] {
    if (s.routing == RoutingMode::fused)
      layer.forward(FusedArgs{d_hidden.view(), d_logits->view(), d_out.view(), d_ids.view(), d_weights.view()});
    else
      layer.forward(ExternalArgs{d_hidden.view(), d_ids.view(), d_weights.view(), d_out.view()});
    synchronize(device);
  };
  auto start = std::chrono::steady_clock::now();
  forward();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (device == Device::cuda) {  // the first call allocates and loads kernels: time a second one
    start = std::chrono::steady_clock::now();
    forward();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  d_out.copy_to(out.view());
  d_ids.copy_to(ids.view());
  d_weights.copy_to(weights.view());
  std::printf("  forward  %.3f ms (%s, wall clock%s)\n", ms, std::string(layer.backend_name()).c_str(),
              device == Device::cuda ? ", second call" : "");

  // The load of the routing the layer ran (the shared experts, every token's, left out).
  std::printf("  routing  %s\n", core::routing_load(ids.view(), s.config.num_experts).to_string().c_str());

  if (args.has("dump")) dump(args.get("dump", ""), s, out, ids, weights);
  if (args.has("check") && !check(s, out, ids, weights)) return 1;
  return 0;
}

}  // namespace moekit::cli
