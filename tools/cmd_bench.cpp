// `moekit bench`: the layer's time per case against the roofline of DESIGN §9.
//   warm-up, then the median of --runs calls; on the GPU timed with CUDA events, small T
//   replayed from CUDA graphs, inputs rotated over several sets so the L2 cache does not
//   flatter small cases; random data (from the seed, or the rows of a layer file), never zeros.
//   The GPU's ceilings (copy bandwidth, cuBLASLt matrix rates) are measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/layer/tactic.h"
#endif

#include "bench_json.h"
#include "bench_roofline.h"
#include "bench_steps.h"
#include "commands.h"
#include "core/shared.h"
#include "core/tuning.h"
#include "core/synthetic.h"
#include "io/layer_file.h"
#include "io/presets.h"
#include "run_setup.h"

namespace moekit::cli {
namespace {

constexpr int kInputSets = 4;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

#ifdef MOEKIT_HAVE_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// One layer to measure: a preset's synthetic weights, or a layer file's.
struct Problem {
  std::string name;
  MoEConfig config;
  std::uint64_t seed = 0;
  std::vector<float> skew_bias;  // --skew: [E], added to every generated input set's logits
  std::optional<core::SyntheticLayer> synthetic;
  std::optional<io::LayerFile> file;

  Weights weights() const { return file ? file->weights() : synthetic->weights(); }
  std::int64_t max_tokens() const { return file ? file->hidden.size(0) : std::int64_t(1) << 20; }

  // Input set `set` of T tokens: hidden [T, H] bf16 and router_logits [T, E], generated, or
  // rows [set T, set T + T) of the file's (rows [0, T) when the file is too short for that).
  std::pair<Tensor, Tensor> inputs(std::int64_t tokens, int set) const {
    if (!file) {
      const std::uint64_t s = seed + 100 + std::uint64_t(set);
      Tensor logits = core::make_router_logits(tokens, config.num_experts, DType::f32, s);
      core::add_router_bias(logits.view(), skew_bias);
      return {core::make_hidden(tokens, config.hidden_size, s), std::move(logits)};
    }
    const std::int64_t first = (set + 1) * tokens <= max_tokens() ? set * tokens : 0;
    return {rows(file->hidden, first, tokens), rows(file->router_logits, first, tokens)};
  }

  static Tensor rows(const Tensor& t, std::int64_t first, std::int64_t count) {
    Tensor out(t.dtype(), {count, t.size(1)});
    const std::size_t row = std::size_t(t.size(1)) * dtype_size(t.dtype());
    std::memcpy(out.view().data, t.ptr<std::byte>() + std::size_t(first) * row, std::size_t(count) * row);
    return out;
  }
};

Problem preset_problem(const std::string& name, const Args& args, std::uint64_t seed) {
  Problem p;
  p.name = name;
  p.seed = seed;
  try {
    p.config = io::with_shared(io::find_preset(name), shared_experts_of(args));
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (args.has("quant")) p.config.quant.scheme = parse_quant_scheme(args.get("quant", ""), "--quant");
  apply_run_options(p.config, args);
  p.skew_bias = skew_bias_of(args, p.config.num_experts, seed);  // one bias for every input set
  std::fprintf(stderr, "bench: %s: generating weights...\n", name.c_str());
  p.synthetic = core::make_synthetic_layer(p.config, seed);
  return p;
}

Problem file_problem(const std::string& path, const Args& args) {
  if (args.has("preset") || args.has("quant"))
    throw UsageError("--inputs: takes the layer and its inputs from the file; drop --preset/--quant");
  if (args.has("shared-experts"))
    throw UsageError("--shared-experts: an --inputs layer file says its own shared experts; drop --shared-experts");
  if (args.has("skew"))
    throw UsageError("--skew: biases generated router logits; a layer file's are its own: drop --skew (a skewed "
                     "file: moekit run --preset NAME --skew SPEC --save-layer FILE)");
  Problem p;
  std::fprintf(stderr, "bench: reading %s...\n", path.c_str());
  p.file = io::read_layer_file(path);
  if (!p.file->router_logits.defined())
    throw UsageError("--inputs: the bench routes from router_logits; " + path + " has none");
  p.config = p.file->config;
  apply_run_options(p.config, args);
  p.name = args.get("name", path.substr(path.find_last_of('/') + 1));
  return p;
}

// The device copies of a case's input sets, and its routing (set 0) on the host.
struct Inputs {
  std::vector<DeviceTensor> hidden, logits;
  DeviceTensor ids, weights, out;
  Tensor host_ids, host_weights;
};

// A shared-expert layer's two parts prepared apart (core::split_shared): what it fuses, timed one
// after the other on the same inputs (what an engine that runs the shared experts beside the
// routed ones does without a second stream).
struct Apart {
  core::SharedParts parts;
  PreparedWeights routed, shared;
  Apart(const Problem& p, const LayerOptions& prepare)
      : parts(core::split_shared(p.config, p.weights())),
        routed(parts.routed, parts.routed_weights, prepare),
        shared(parts.shared, parts.shared_weights, prepare),
        weight(p.config.shared_expert_weight) {}
  float weight;  // the shared experts' routing weight
};

// The routing the fused layer's stages see (the shared experts appended), on the host: the roofline
// counts their pairs and weights.
Tensor stage_ids(const MoEConfig& c, const Inputs& in) {
  const std::int64_t tokens = in.host_ids.size(0), k = c.top_k() + c.shared_experts;
  Tensor ids(DType::i32, {tokens, k}), weights(DType::f32, {tokens, k});
  core::append_shared(c, tokens, in.host_ids.ptr<std::int32_t>(), in.host_weights.ptr<float>(), ids.ptr<std::int32_t>(),
                      weights.ptr<float>());
  return ids;
}

Inputs make_inputs(const Problem& p, std::int64_t tokens, Device device) {
  const MoEConfig& c = p.config;
  Inputs in{{}, {}, DeviceTensor(DType::i32, {tokens, c.top_k()}, device),
            DeviceTensor(DType::f32, {tokens, c.top_k()}, device), DeviceTensor(DType::bf16, {tokens, c.hidden_size}, device),
            Tensor(DType::i32, {tokens, c.top_k()}), Tensor(DType::f32, {tokens, c.top_k()})};
  for (int s = 0; s < kInputSets; ++s) {
    const auto [h, l] = p.inputs(tokens, s);
    in.hidden.emplace_back(h.dtype(), h.shape(), device);
    in.hidden.back().copy_from(h.view());
    in.logits.emplace_back(l.dtype(), l.shape(), device);
    in.logits.back().copy_from(l.view());
    if (s == 0)  // the routing of set 0 sizes the roofline and feeds external routing
      route(c.routing, {l.view(), c.routing.uses_bias() ? p.weights().e_score_correction_bias : TensorView{}},
            {in.host_ids.view(), in.host_weights.view()});
  }
  in.ids.copy_from(in.host_ids.view());
  in.weights.copy_from(in.host_weights.view());
  return in;
}

struct Settings {
  std::vector<std::int64_t> tokens;
  std::string graph = "auto";
  bool fused = true;
  bool stages = false;
  int runs = 0;  // 0: the device's default
  std::string skew;  // --skew as given ("" without)
  std::vector<std::string> tuning{""};  // --tuning-cache: one pass per cache ("": the layer's default)
};

#ifdef MOEKIT_HAVE_CUDA
// call(set, stream) captured in a CUDA graph on `stream` and instantiated.
cudaGraphExec_t capture_call(cudaStream_t stream, int set, const std::function<void(int, Stream)>& call) {
  cudaGraph_t g;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  call(set, stream);
  check(cudaStreamEndCapture(stream, &g), "capture");
  cudaGraphExec_t exec;
  const cudaError_t made = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check(made, "cudaGraphInstantiate");
  return exec;
}
#endif

// Median µs of `runs` calls of call(set, stream), set rotating over the input sets; on the GPU
// replayed from one CUDA graph per set when `graph`.
double time_calls(Device device, int runs, [[maybe_unused]] bool graph, const std::function<void(int, Stream)>& call) {
  std::vector<double> us;
  if (device == Device::cpu) {
    for (int r = 0; r < runs; ++r) {
      const auto start = std::chrono::steady_clock::now();
      call(r % kInputSets, nullptr);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    return median(us);
  }
#ifdef MOEKIT_HAVE_CUDA
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaGraphExec_t> graphs;
  for (int s = 0; graph && s < kInputSets; ++s) graphs.push_back(capture_call(stream, s, call));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < runs + 3; ++i) {
    const int set = i % kInputSets;
    cudaEventRecord(start, stream);
    if (graph) check(cudaGraphLaunch(graphs[std::size_t(set)], stream), "cudaGraphLaunch");
    else call(set, stream);
    cudaEventRecord(stop, stream);
    check(cudaEventSynchronize(stop), "layer");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 3) us.push_back(double(ms) * 1e3);
  }
  for (auto g : graphs) cudaGraphExecDestroy(g);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
#endif
  return median(us);
}

// The median host time of one eager call on the GPU: what the call takes to enqueue its work
// (the device idle before each), which bounds an eager layer when it exceeds the device's time.
double host_call_us(Device device, int runs, const std::function<void(int, Stream)>& call) {
  std::vector<double> us;
  for (int r = 0; r < runs; ++r) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    call(r % kInputSets, nullptr);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  synchronize(device);
  return median(us);
}

// Each step's median µs over `runs` eager calls, in the order the steps ran. StepClock::host: where
// a call's host time goes (the device idle before each, as host_call_us): "checks" from the call's
// start to its first step (arguments, the T's sizes and tactic, buffers), each step's enqueueing, and
// "end" from the last step to the return.
std::vector<std::pair<std::string, double>> time_steps(Device device, int runs, StepTimes& steps, StepClock clock,
                                                       const std::function<void(int, Stream)>& call) {
  const bool host = clock == StepClock::host;
  std::vector<std::string> order;
  std::map<std::string, std::vector<double>> samples;
  for (int r = 0; r < runs; ++r) {
    if (host) synchronize(device);
    steps.begin(clock);
    if (host) steps.step("checks", nullptr);
    call(r % kInputSets, nullptr);
    if (host) steps.step("returned", nullptr);
    synchronize(device);
    for (const auto& [name, us] : steps.finish()) {
      if (!samples.count(name)) order.push_back(name);
      samples[name].push_back(us);
    }
  }
  std::vector<std::pair<std::string, double>> out;
  for (const std::string& name : order) out.emplace_back(name, median(samples[name]));
  return out;
}

// Each step's median µs over `runs` replays of the forward captured in CUDA graphs (one per input
// set) with the steps' marks as event nodes between the kernels: what each step takes in the replays
// the layer's time comes from, launch gaps included (the eager steps add the host's). The nodes keep
// a kernel from starting before the previous one ends (no programmatic overlap across a mark).
std::vector<std::pair<std::string, double>> time_graph_steps(int runs, StepTimes& steps,
                                                             [[maybe_unused]] const std::function<void(int, Stream)>& call) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<double>> samples;
#ifdef MOEKIT_HAVE_CUDA
  // The stream, the graphs and the marks, released however this ends (a capture the layer's launches
  // broke is ended and dropped: the stream leaves capture mode).
  struct Replays {
    StepTimes& steps;
    cudaStream_t stream = nullptr;
    std::vector<cudaGraphExec_t> graphs;
    ~Replays() {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (stream && cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
          capturing != cudaStreamCaptureStatusNone) {
        cudaGraph_t dropped = nullptr;
        cudaStreamEndCapture(stream, &dropped);
        if (dropped) cudaGraphDestroy(dropped);
      }
      for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
      if (stream) cudaStreamDestroy(stream);
      steps.hold();
      cudaGetLastError();  // a failed capture's error is not the next call's
    }
  } r{steps, nullptr, {}};
  check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int s = 0; s < kInputSets; ++s) {
    steps.begin(StepClock::device);
    r.graphs.push_back(capture_call(r.stream, s, call));
    steps.hold();
  }
  // Every set's graph records the same events (the marks' order is the same): read after each replay.
  for (int i = 0; i < runs + 3; ++i) {
    check(cudaGraphLaunch(r.graphs[std::size_t(i % kInputSets)], r.stream), "cudaGraphLaunch");
    check(cudaStreamSynchronize(r.stream), "layer");
    if (i < 3) continue;
    for (const auto& [name, us] : steps.elapsed()) {
      if (!samples.count(name)) order.push_back(name);
      samples[name].push_back(us);
    }
  }
#else
  (void)runs;
  (void)steps;
#endif
  std::vector<std::pair<std::string, double>> out;
  for (const std::string& name : order) out.emplace_back(name, median(samples[name]));
  return out;
}

// "name 1.2 | name 3.4 | sum 4.6"
std::string steps_line(const std::vector<std::pair<std::string, double>>& steps) {
  double sum = 0;
  std::string line;
  for (const auto& [name, us] : steps) {
    sum += us;
    char item[64];
    std::snprintf(item, sizeof item, "%s %.1f | ", name.c_str(), us);
    line += item;
  }
  char total[32];
  std::snprintf(total, sizeof total, "sum %.1f", sum);
  return line + total;
}

std::int64_t prepared_tokens(const Settings& settings) {
  return *std::max_element(settings.tokens.begin(), settings.tokens.end());
}

void print_case(const BenchCase& r) {
  std::printf("%-16s %-16s T=%-6lld %10.1f us %8.1f TFLOP/s %7.0f GB/s  experts=%-4lld floor=%8.1f us  eff=%5.1f%%%s\n",
              r.preset.c_str(), r.quant.c_str(), static_cast<long long>(r.tokens), r.us, r.roof.flops / r.us / 1e6,
              r.roof.bytes / r.us / 1e3, static_cast<long long>(r.roof.experts_touched), r.floor_us,
              r.floor_us > 0 ? 100.0 * r.floor_us / r.us : 0.0, r.graph ? " (graph)" : "");
  std::printf("    routing: %s%s\n", r.load.to_string().c_str(), r.skew.empty() ? "" : (", skew " + r.skew).c_str());
  if (r.host_us > 0) std::printf("    host per eager call: %.1f us\n", r.host_us);
  if (!r.host_steps.empty())
    std::printf("    host per step (µs, median, enqueue only): %s\n", steps_line(r.host_steps).c_str());
  if (!r.tuning.empty())
    std::printf("    tuning cache: %s%s\n", r.tuning.c_str(), r.tuning_read.empty() ? "" : (": " + r.tuning_read).c_str());
  if (r.routed_us > 0)
    std::printf("    apart: routed %.1f us + shared %.1f us = %.1f us; fused %.1f us (%.2fx)\n", r.routed_us, r.shared_us,
                r.routed_us + r.shared_us, r.us, r.us / (r.routed_us + r.shared_us));
  if (!r.stages.empty())
    std::printf("    stages (µs, eager, events between steps): %s\n", steps_line(r.stages).c_str());
  if (!r.graph_stages.empty())
    std::printf("    stages (µs, graph replays, event nodes between steps): %s\n", steps_line(r.graph_stages).c_str());
  std::fflush(stdout);
}

// r.routed_us and r.shared_us: the two parts of r's layer timed on the same inputs as it.
void time_apart(const Apart& apart, const LayerOptions& options, const Settings& settings, Inputs& in, int runs,
                BenchCase& r) {
  Layer routed(apart.routed, options), shared(apart.shared, options);
  const Device device = routed.device();
  const std::int64_t count = apart.parts.shared.top_k();
  Tensor ids(DType::i32, {r.tokens, count}), weights(DType::f32, {r.tokens, count});
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    ids.ptr<std::int32_t>()[i] = std::int32_t(i % count);  // every token to each shared expert
    weights.ptr<float>()[i] = apart.weight;
  }
  DeviceTensor d_ids(DType::i32, ids.shape(), device), d_weights(DType::f32, weights.shape(), device);
  d_ids.copy_from(ids.view());
  d_weights.copy_from(weights.view());
  const std::function<void(int, Stream)> routed_call = [&](int set, Stream stream) {
    const std::size_t s = std::size_t(set);
    if (settings.fused)
      routed.forward(FusedArgs{in.hidden[s].view(), in.logits[s].view(), in.out.view(), in.ids.view(), in.weights.view()},
                     stream);
    else
      routed.forward(ExternalArgs{in.hidden[s].view(), in.ids.view(), in.weights.view(), in.out.view()}, stream);
  };
  const std::function<void(int, Stream)> shared_call = [&](int set, Stream stream) {
    shared.forward(ExternalArgs{in.hidden[std::size_t(set)].view(), d_ids.view(), d_weights.view(), in.out.view()}, stream);
  };
  for (int w = 0; w < 2; ++w) {  // allocates before any capture
    routed_call(w % kInputSets, nullptr);
    shared_call(w % kInputSets, nullptr);
  }
  synchronize(device);
  r.routed_us = time_calls(device, runs, r.graph, routed_call);
  r.shared_us = time_calls(device, runs, r.graph, shared_call);
}

void bench_problem(const Problem& p, const Settings& settings, const std::string& tuning,
                   const PreparedWeights& prepared, const Apart* apart, const Ceilings& ceilings,
                   std::vector<BenchCase>& results) {
  StepTimes steps(prepared.device());
  LayerOptions options;
  options.observer = &steps;  // inactive (costs nothing) except in the --stages calls
  options.max_tokens = prepared_tokens(settings);
  options.tuning.cache = tuning;
  Layer layer(prepared, options);
  const Device device = layer.device();
  const int runs = settings.runs > 0 ? settings.runs : device == Device::cuda ? 20 : 3;
  // What the layer read (a rejected file means the heuristic: said, not only the path given).
  std::string tuning_read;
#ifdef MOEKIT_HAVE_CUDA
  if (!tuning.empty() && device == Device::cuda) tuning_read = core::load_tuning(options.tuning, cuda::this_device()).to_string();
#endif
  for (std::int64_t tokens : settings.tokens) {
    if (tokens > p.max_tokens())
      throw UsageError("--tokens: " + std::to_string(tokens) + " is more than the file's " +
                       std::to_string(p.max_tokens()) + " rows");
    std::fprintf(stderr, "bench: %s T=%lld%s...\n", p.name.c_str(), static_cast<long long>(tokens),
                 tuning.empty() ? "" : (" (tuning cache " + tuning + ")").c_str());
    Inputs in = make_inputs(p, tokens, device);
    auto call = [&](int set, Stream stream) {
      const std::size_t s = std::size_t(set);
      if (settings.fused)
        layer.forward(FusedArgs{in.hidden[s].view(), in.logits[s].view(), in.out.view(), in.ids.view(), in.weights.view()},
                      stream);
      else
        layer.forward(ExternalArgs{in.hidden[s].view(), in.ids.view(), in.weights.view(), in.out.view()}, stream);
    };
    BenchCase r;
    r.preset = p.name;
    r.quant = std::string(to_string(p.config.quant.scheme));
    // An FP8 label names every accumulation but exact, the default of the results recorded before
    // fast became it (docs/bench): "fp8-block" keeps meaning exact there and here.
    const QuantConfig& q = p.config.quant;
    if (q.scheme != QuantScheme::bf16 && q.accumulation != Fp8Accumulation::exact)
      r.quant += "+" + std::string(to_string(q.accumulation));
    if (p.config.batch_invariant) r.quant += "+batch-invariant";
    if (p.config.experts_path != ExpertsPath::automatic) r.quant += "+" + std::string(to_string(p.config.experts_path));
    r.tokens = tokens;
    r.tuning = tuning;
    r.tuning_read = tuning_read;
    r.load = core::routing_load(in.host_ids.view(), p.config.num_experts);  // input set 0's
    r.skew = settings.skew;
    const bool shares = p.config.shared_experts > 0;
    r.roof = shares ? roofline(core::experts_config(p.config), stage_ids(p.config, in).view())
                    : roofline(p.config, in.host_ids.view());
    r.floor_us = r.roof.floor_us(ceilings, p.config.quant.scheme);
    r.graph = device == Device::cuda && (settings.graph == "on" || (settings.graph == "auto" && tokens <= 512));
    for (int w = 0; w < 2; ++w) call(w % kInputSets, nullptr);  // allocates before any capture
    synchronize(device);
    r.us = time_calls(device, runs, r.graph, call);
    if (device == Device::cuda) {
      r.host_us = host_call_us(device, runs, call);
      r.host_steps = time_steps(device, runs, steps, StepClock::host, call);
    }
    if (settings.stages) r.stages = time_steps(device, runs, steps, StepClock::device, call);
    if (settings.stages && r.graph) {
      try {
        r.graph_stages = time_graph_steps(runs, steps, call);
      } catch (const Error& e) {  // the eager steps and the layer's time stand without them
        std::fprintf(stderr, "bench: the steps in graph replays not measured at T=%lld: %s\n",
                     static_cast<long long>(tokens), e.what());
      }
    }
    if (apart) time_apart(*apart, options, settings, in, runs, r);
    results.push_back(r);
    print_case(r);
  }
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<Flag> flags = {
      {"preset", true, "preset[,preset...] (moekit presets)"},
      {"inputs", true, "a layer file (DESIGN §2): its weights, and its first rows as each case's tokens"},
      {"name", true, "the name of the --inputs layer in the results (default: the file name)"},
      {"tokens", true, "T[,T...] (default 1,8,64,512,4096)"},
      {"quant", true, "bf16|fp8-tensor|fp8-rowwise|fp8-block (default: each preset's)"},
      accumulation_flag(),
      batch_invariance_flag(),
      path_flag(),
      {"routing", true, "fused|external (default fused)"},
      {"shared-experts", true,
       "N: the preset with its model's N shared experts fused (deepseek-v3: 1), each case also timed as its two "
       "parts run apart (the routed layer, then the shared experts alone)"},
      {"backend", true, "auto|cpu|... (default auto)"},
      {"graph", true, "auto|on|off: replay CUDA graphs (auto: T <= 512)"},
      {"stages", false, "also time each step of the layer: eager calls with events between the steps, and (graph "
                        "cases) graph replays with event nodes between them"},
      {"runs", true, "timed calls per case (default 20 on a GPU, 3 on the CPU)"},
      {"seed", true, "seed of weights and inputs (default 1)"},
      skew_flag(),
      {"json", true, "also write the results to this JSON file"},
      {"tuning-cache", true,
       "FILE|off[,...]: the tuning cache of the layer (docs/TUNE.md; default: MOEKIT_TUNING_CACHE, else the "
       "per-user one); several: one pass each on the same weights (e.g. off,data/tuning/h200.json)"},
      {"ep", true, "expert parallelism over N ranks: mpirun -np N moekit bench --ep N (see --help there)"},
      {"ep-combine", true, "with --ep: auto|exact|partial[,...] (a table each)"},
      {"help", false, "this text"},
  };
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("bench", flags).c_str());
    return 0;
  }
  if (args.get_int("ep", 1, 1, 1 << 16) > 1) return cmd_bench_ep(args);
  if (args.has("ep-combine")) throw UsageError("--ep-combine: needs --ep N with N > 1");
  if (!args.has("preset") && !args.has("inputs")) throw UsageError("give --preset NAME[,NAME...] or --inputs FILE");
  if (args.has("name") && !args.has("inputs")) throw UsageError("--name: names an --inputs layer; give --inputs");
  Settings settings;
  settings.tokens = args.get_int_list("tokens", "1,8,64,512,4096", 1, 1 << 20);
  settings.graph = args.get("graph", "auto");
  if (settings.graph != "auto" && settings.graph != "on" && settings.graph != "off")
    throw UsageError("--graph: expected one of auto|on|off, given '" + settings.graph + "'");
  const std::string routing = args.get("routing", "fused");
  if (routing != "fused" && routing != "external")
    throw UsageError("--routing: expected one of fused|external, given '" + routing + "'");
  settings.fused = routing == "fused";
  if (args.has("skew")) {
    settings.skew = skew_of(args).to_string();  // a bad SPEC is named first
    if (!settings.fused)
      throw UsageError("--skew: biases the router logits the layer routes; with --routing external it is given "
                       "topk_ids/topk_weights instead: drop --skew or use --routing fused");
  }
  settings.stages = args.has("stages");
  settings.runs = int(args.get_int("runs", 0, 1, 10000));
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));
  if (args.has("tuning-cache")) settings.tuning = args.get_list("tuning-cache", "");

  BenchRecord record;
  record.routing = routing;
  record.skew = settings.skew;
  std::vector<Problem> problems;
  if (args.has("inputs")) problems.push_back(file_problem(args.get("inputs", ""), args));
  else
    for (const std::string& name : args.get_list("preset", "")) problems.push_back(preset_problem(name, args, seed));
  record.backend = select_backend(problems.front().config, args.get("backend", "auto")).chosen;
  if (record.backend == "cuda") {
    std::fprintf(stderr, "bench: measuring the GPU's ceilings (copy, cuBLASLt bf16/fp8/fp8-block)...\n");
    record.gpu = gpu_info();
    record.ceilings = measure_ceilings(true);
    std::printf("gpu: %s, %d SMs, driver %s\n", record.gpu.name.c_str(), record.gpu.sms, record.gpu.driver.c_str());
    std::printf("ceilings: copy %.0f GB/s; matrix bf16 %.1f, fp8 %.1f, fp8-block %.1f TFLOP/s (%s)\n",
                record.ceilings.copy_gbs, record.ceilings.bf16_tflops, record.ceilings.fp8_tflops,
                record.ceilings.fp8_block_tflops, record.ceilings.source.c_str());
    std::fflush(stdout);
  }
  for (const Problem& p : problems) {
    LayerOptions prepare;
    prepare.backend = args.get("backend", "auto");
    prepare.max_tokens = prepared_tokens(settings);
    const PreparedWeights prepared(p.config, p.weights(), prepare);
    std::optional<Apart> apart;
    if (p.config.shared_experts > 0) apart.emplace(p, prepare);
    for (const std::string& tuning : settings.tuning)
      bench_problem(p, settings, tuning, prepared, apart ? &*apart : nullptr, record.ceilings, record.cases);
  }
  if (args.has("json")) write_bench_json(args.get("json", ""), record);
  return 0;
}

}  // namespace moekit::cli
