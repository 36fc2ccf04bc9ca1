// `moekit bench`: the layer's time per case against the roofline of DESIGN §9.
//   warm-up, then the median of --runs calls; on the GPU timed with CUDA events, small T
//   replayed from CUDA graphs, inputs rotated over several sets so the L2 cache does not
//   flatter small cases; random data from the seed, never zeros.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "bench_roofline.h"
#include "commands.h"
#include "core/synthetic.h"
#include "io/presets.h"
#include "run_setup.h"

namespace moekit::cli {
namespace {

constexpr int kInputSets = 4;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

#ifdef MOEKIT_HAVE_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// B: a large device-to-device copy, bytes read + written over the median time.
double measure_copy_gbs() {
  const std::size_t bytes = std::size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "copy");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
}
#endif

struct Inputs {
  std::vector<DeviceTensor> hidden, logits;
  DeviceTensor ids, weights, out;
  Tensor host_ids, host_weights;
};

Inputs make_inputs(const MoEConfig& c, const Weights& w, std::int64_t tokens, std::uint64_t seed, Device device) {
  Inputs in{{}, {}, DeviceTensor(DType::i32, {tokens, c.top_k()}, device),
            DeviceTensor(DType::f32, {tokens, c.top_k()}, device), DeviceTensor(DType::bf16, {tokens, c.hidden_size}, device),
            Tensor(DType::i32, {tokens, c.top_k()}), Tensor(DType::f32, {tokens, c.top_k()})};
  for (int s = 0; s < kInputSets; ++s) {
    const Tensor h = core::make_hidden(tokens, c.hidden_size, seed + std::uint64_t(s));
    const Tensor l = core::make_router_logits(tokens, c.num_experts, DType::f32, seed + std::uint64_t(s));
    in.hidden.emplace_back(DType::bf16, h.shape(), device);
    in.hidden.back().copy_from(h.view());
    in.logits.emplace_back(DType::f32, l.shape(), device);
    in.logits.back().copy_from(l.view());
    if (s == 0)  // the routing of set 0 sizes the roofline and feeds external routing
      route(c.routing, {l.view(), c.routing.uses_bias() ? w.e_score_correction_bias : TensorView{}},
            {in.host_ids.view(), in.host_weights.view()});
  }
  in.ids.copy_from(in.host_ids.view());
  in.weights.copy_from(in.host_weights.view());
  return in;
}

struct CaseResult {
  std::string preset, quant;
  std::int64_t tokens = 0;
  double us = 0;
  bool graph = false;
  Roofline roof;
};

class Timer {
 public:
  virtual ~Timer() = default;
  // Median microseconds of `runs` calls of call(set), set rotating over the input sets.
  virtual double median_us(int runs, const std::function<void(int)>& call) = 0;
};

class HostTimer final : public Timer {
 public:
  double median_us(int runs, const std::function<void(int)>& call) override {
    std::vector<double> us;
    for (int r = 0; r < runs; ++r) {
      const auto start = std::chrono::steady_clock::now();
      call(r % kInputSets);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    return median(us);
  }
};

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<Flag> flags = {
      {"preset", true, "preset[,preset...] (moekit presets)"},
      {"tokens", true, "T[,T...] (default 1,8,64,512,4096)"},
      {"quant", true, "bf16|fp8-tensor|fp8-rowwise|fp8-block (default: each preset's)"},
      {"routing", true, "fused|external (default fused)"},
      {"backend", true, "auto|cpu|... (default auto)"},
      {"graph", true, "auto|on|off: replay CUDA graphs (auto: T <= 512)"},
      {"runs", true, "timed calls per case (default 20 on a GPU, 3 on the CPU)"},
      {"seed", true, "seed of weights and inputs (default 1)"},
      {"json", true, "also write the results to this JSON file"},
      {"help", false, "this text"},
  };
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("bench", flags).c_str());
    return 0;
  }
  if (!args.has("preset")) throw UsageError("give --preset NAME[,NAME...]");
  std::vector<std::int64_t> token_list;
  for (const std::string& t : split(args.get("tokens", "1,8,64,512,4096"))) {
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > (1 << 20)) throw UsageError("--tokens: expected integers in [1, 1048576], given '" + t + "'");
    token_list.push_back(v);
  }
  const std::string graph_mode = args.get("graph", "auto");
  if (graph_mode != "auto" && graph_mode != "on" && graph_mode != "off")
    throw UsageError("--graph: expected one of auto|on|off, given '" + graph_mode + "'");
  const bool fused = args.get("routing", "fused") != "external";
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));

  std::vector<CaseResult> results;
  Ceilings ceilings;
  for (const std::string& name : split(args.get("preset", ""))) {
    const io::Preset& preset = io::find_preset(name);
    MoEConfig config = preset.config;
    if (args.has("quant")) config.quant.scheme = parse_quant_scheme(args.get("quant", ""), "--quant");
    validate(config);
    std::fprintf(stderr, "bench: %s: generating weights...\n", name.c_str());
    const core::SyntheticLayer layer_weights = core::make_synthetic_layer(config, seed);
    LayerOptions options;
    options.backend = args.get("backend", "auto");
    Layer layer(config, layer_weights.weights(), options);
    const Device device = layer.device();
    const int runs = int(args.get_int("runs", device == Device::cuda ? 20 : 3, 1, 10000));
#ifdef MOEKIT_HAVE_CUDA
    if (device == Device::cuda && ceilings.copy_gbs == 0) {
      ceilings = {config.quant.scheme == QuantScheme::bf16 ? 751.0 : 1271.0, measure_copy_gbs(),
                  "copy measured now; matrix rate from DESIGN §9 (H200, cuBLASLt)"};
    }
#endif
    for (std::int64_t tokens : token_list) {
      std::fprintf(stderr, "bench: %s T=%lld...\n", name.c_str(), static_cast<long long>(tokens));
      Inputs in = make_inputs(config, layer_weights.weights(), tokens, seed + 100, device);
      auto call = [&](int set, Stream stream) {
        if (fused)
          layer.forward(FusedArgs{in.hidden[std::size_t(set)].view(), in.logits[std::size_t(set)].view(), in.out.view(),
                                  in.ids.view(), in.weights.view()},
                        stream);
        else
          layer.forward(ExternalArgs{in.hidden[std::size_t(set)].view(), in.ids.view(), in.weights.view(), in.out.view()},
                        stream);
      };
      CaseResult r{name, std::string(to_string(config.quant.scheme)), tokens, 0, false, roofline(config, in.host_ids.view())};
      for (int w = 0; w < 2; ++w) call(w % kInputSets, nullptr);
      synchronize(device);
      if (device == Device::cpu) {
        HostTimer timer;
        r.us = timer.median_us(runs, [&](int set) { call(set, nullptr); });
      }
#ifdef MOEKIT_HAVE_CUDA
      else {
        cudaStream_t stream;
        check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        r.graph = graph_mode == "on" || (graph_mode == "auto" && tokens <= 512);
        std::vector<cudaGraphExec_t> graphs;
        if (r.graph) {
          for (int s = 0; s < kInputSets; ++s) {
            cudaGraph_t g;
            check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
            call(s, stream);
            check(cudaStreamEndCapture(stream, &g), "capture");
            cudaGraphExec_t exec;
            check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
            cudaGraphDestroy(g);
            graphs.push_back(exec);
          }
        }
        cudaEvent_t start, stop;
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
        std::vector<double> us;
        for (int i = 0; i < runs + 3; ++i) {
          const int set = i % kInputSets;
          cudaEventRecord(start, stream);
          if (r.graph) check(cudaGraphLaunch(graphs[std::size_t(set)], stream), "cudaGraphLaunch");
          else call(set, stream);
          cudaEventRecord(stop, stream);
          check(cudaEventSynchronize(stop), "layer");
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          if (i >= 3) us.push_back(double(ms) * 1e3);
        }
        r.us = median(us);
        for (auto g : graphs) cudaGraphExecDestroy(g);
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        cudaStreamDestroy(stream);
      }
#endif
      results.push_back(r);
      const double floor = r.roof.floor_us(ceilings);
      std::printf("%-16s %-11s T=%-6lld %10.1f us %8.1f TFLOP/s %7.0f GB/s  experts=%-4lld floor=%8.1f us  eff=%5.1f%%%s\n",
                  r.preset.c_str(), r.quant.c_str(), static_cast<long long>(tokens), r.us, r.roof.flops / r.us / 1e6,
                  r.roof.bytes / r.us / 1e3, static_cast<long long>(r.roof.experts_touched), floor,
                  floor > 0 ? 100.0 * floor / r.us : 0.0, r.graph ? " (graph)" : "");
      std::fflush(stdout);
    }
  }
  if (ceilings.copy_gbs > 0)
    std::printf("ceilings: copy %.0f GB/s, matrix %.0f TFLOP/s (%s)\n", ceilings.copy_gbs, ceilings.matrix_tflops,
                ceilings.source);
  if (args.has("json")) {
    std::ofstream json(args.get("json", ""));
    json << "{\"moekit_version\": \"" << version() << "\", \"copy_gbs\": " << ceilings.copy_gbs
         << ", \"matrix_tflops\": " << ceilings.matrix_tflops << ", \"cases\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const CaseResult& r = results[i];
      json << (i ? ", " : "") << "{\"preset\": \"" << r.preset << "\", \"quant\": \"" << r.quant << "\", \"tokens\": "
           << r.tokens << ", \"us\": " << r.us << ", \"flops\": " << r.roof.flops << ", \"bytes\": " << r.roof.bytes
           << ", \"floor_us\": " << r.roof.floor_us(ceilings) << ", \"graph\": " << (r.graph ? "true" : "false") << "}";
    }
    json << "]}\n";
  }
  return 0;
}

}  // namespace moekit::cli
