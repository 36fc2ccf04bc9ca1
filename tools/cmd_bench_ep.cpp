// `mpirun -np N moekit bench --ep N --preset P --tokens T[,T...]`: expert parallelism measured.
// T is tokens per rank. For each T, on every rank:
//   layer     the whole EP forward (host wall clock from a barrier to the end of its device work,
//             median of --runs), the slowest rank's;
//   steps     dispatch and combine (EpTiming::barriers: each exchange starts together, each step
//             waits for its device work), median per rank, with the bytes each sent to other ranks;
//   fixed     the forward of fixed capacity T (no host in it: EpOptions::capacity), waited for
//             through the communicator; on GPUs also replayed from a CUDA graph; the slowest rank's;
// next to the link's peak (a large all-to-all over the same communicator) and, on rank 0, the
// single-device layer on the whole batch (N T tokens, the same weights and tokens).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cli_args.h"
#include "commands.h"
#include "core/synthetic.h"
#include "ep_ranks.h"
#include "io/presets.h"
#include "moekit/comm.h"
#include "moekit/device.h"
#include "moekit/moekit.h"
#include "run_setup.h"

namespace moekit::cli {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Median ms of `runs` calls after 2 warm-ups, each started after a barrier of `comm`.
double median_ms(Communicator& comm, int runs, const std::function<void()>& call) {
  std::vector<double> ms;
  for (int i = 0; i < runs + 2; ++i) {
    comm.barrier(nullptr);
    const auto start = Clock::now();
    call();
    if (i >= 2) ms.push_back(ms_since(start));
  }
  return median(ms);
}

// The link's peak as our exchanges see it: an all-to-all of `block` bytes to every other rank.
// Returns GB/s sent to other ranks per rank.
double link_gbs(Communicator& comm, Device device, std::size_t block) {
  const std::size_t n = std::size_t(comm.size());
  DeviceTensor send(DType::u8, {std::int64_t(n * block)}, device), recv(DType::u8, {std::int64_t(n * block)}, device);
  std::vector<std::int64_t> counts(n, std::int64_t(block)), offsets(n);
  for (std::size_t r = 0; r < n; ++r) offsets[r] = std::int64_t(r * block);
  counts[std::size_t(comm.rank())] = 0;  // nothing to itself: the link alone
  const double ms = median_ms(comm, 10, [&] {
    comm.all_to_all_v({send.view().data, counts, offsets, recv.view().data, counts, offsets, 1}, nullptr);
    comm.synchronize(nullptr);
  });
  return double(block) * double(n - 1) / (ms * 1e-3) / 1e9;
}

struct RankRow {  // one rank's medians for one T
  double layer_ms = 0, dispatch_ms = 0, combine_ms = 0;
  double fixed_ms = 0, graph_ms = 0;  // fixed capacity T: eager, from a CUDA graph (0: none)
  double dispatch_remote_bytes = 0, combine_remote_bytes = 0;
};

struct Case {
  std::int64_t tokens = 0;  // per rank
  std::vector<RankRow> ranks;
  double single_ms = 0;     // rank 0: one device, N T tokens
};

struct Link {
  std::size_t block = 0;  // bytes to each other rank
  double gbs = 0;         // sent to other ranks per rank
};

void print_cases(const MoEConfig& c, const std::string& preset, Communicator& comm, EpCombine combine, const Link& link,
                 const std::vector<Case>& cases) {
  const int n = comm.size();
  std::printf("moekit bench --ep %d: %s %s, %s over %s, combine %s, dispatch %s rows, combine bf16 rows\n", n,
              preset.c_str(), std::string(to_string(c.quant.scheme)).c_str(), c.to_string().c_str(),
              std::string(comm.name()).c_str(), std::string(to_string(combine)).c_str(),
              std::string(to_string(c.quant.scheme)).c_str());
  std::printf("link peak: all-to-all of %zu MiB to each other rank: %.1f GB/s sent per rank\n", link.block >> 20, link.gbs);
  std::printf("%8s %10s %10s %10s %10s %11s %10s | %9s %9s %8s %6s | %9s %9s %8s %6s\n", "T/rank", "EP ms", "us/token",
              "fixed ms", "graph ms", "1-dev ms", "us/token", "disp ms", "MB out", "GB/s", "%peak", "comb ms", "MB out",
              "GB/s", "%peak");
  for (const Case& k : cases) {
    RankRow worst;  // the slowest rank's time, the busiest rank's bytes
    for (const RankRow& r : k.ranks) {
      worst.layer_ms = std::max(worst.layer_ms, r.layer_ms);
      worst.fixed_ms = std::max(worst.fixed_ms, r.fixed_ms);
      worst.graph_ms = std::max(worst.graph_ms, r.graph_ms);
      if (r.dispatch_ms > worst.dispatch_ms) {
        worst.dispatch_ms = r.dispatch_ms;
        worst.dispatch_remote_bytes = r.dispatch_remote_bytes;
      }
      if (r.combine_ms > worst.combine_ms) {
        worst.combine_ms = r.combine_ms;
        worst.combine_remote_bytes = r.combine_remote_bytes;
      }
    }
    const double total = double(k.tokens * n);
    const double dgbs = worst.dispatch_remote_bytes / (worst.dispatch_ms * 1e-3) / 1e9;
    const double cgbs = worst.combine_remote_bytes / (worst.combine_ms * 1e-3) / 1e9;
    std::printf("%8lld %10.3f %10.2f %10.3f %10.3f %11.3f %10.2f | %9.3f %9.2f %8.1f %6.1f | %9.3f %9.2f %8.1f %6.1f\n",
                static_cast<long long>(k.tokens), worst.layer_ms, worst.layer_ms * 1e3 / total, worst.fixed_ms,
                worst.graph_ms, k.single_ms,
                k.single_ms * 1e3 / total, worst.dispatch_ms, worst.dispatch_remote_bytes / 1e6, dgbs,
                100.0 * dgbs / link.gbs, worst.combine_ms, worst.combine_remote_bytes / 1e6, cgbs, 100.0 * cgbs / link.gbs);
  }
  std::printf("(EP ms: the slowest rank, barrier to end of device work; fixed, graph: capacity T, eager and from a "
              "CUDA graph (0: CPU ranks), the same; steps: the slowest rank's median with its bytes to other ranks; "
              "1-dev: rank 0's device alone on all N T tokens, wall clock)\n");
  std::fflush(stdout);
}

// The whole batch of a case: N T tokens, the same on every rank; rank r's are rows [r T, r T + T).
struct Batch {
  MoEConfig whole;
  std::uint64_t seed = 0;
  int ranks = 1;
  std::vector<float> skew_bias;  // --skew: [E], added to the logits; empty without
  std::pair<Tensor, Tensor> make(std::int64_t tokens_per_rank) const {
    const std::int64_t total = tokens_per_rank * ranks;
    Tensor logits = core::make_router_logits(total, whole.num_experts, DType::f32, seed + 100);
    core::add_router_bias(logits.view(), skew_bias);
    return {core::make_hidden(total, whole.hidden_size, seed + 100), std::move(logits)};
  }
};

struct EpLayers {
  Layer* plain;     // EpTiming::plain: the layer's time
  Layer* profiled;  // EpTiming::barriers: each step's time
  Layer* fixed;     // EpOptions::capacity T: no host in the forward
  Communicator* comm;  // the layers' (NCCL on GPUs)
};

#ifdef MOEKIT_HAVE_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// The fixed-capacity forward, waited for through the communicator (its timeout), eager and on a
// GPU replayed from a CUDA graph of one forward.
void measure_fixed(Communicator& world, const EpLayers& layers, const FusedArgs& args, int runs, RankRow& row) {
  Layer& fixed = *layers.fixed;
  Communicator& comm = *layers.comm;
  row.fixed_ms = median_ms(world, runs, [&] {
    fixed.forward(args);
    comm.synchronize(nullptr);
  });
#ifdef MOEKIT_HAVE_CUDA
  if (fixed.device() != Device::cuda) return;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  fixed.forward(args, stream);
  check(cudaStreamEndCapture(stream, &graph), "capture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  row.graph_ms = median_ms(world, runs, [&] {
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    comm.synchronize(stream);
  });
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
#endif
}

// This rank's medians for T tokens per rank, gathered from every rank.
Case measure_ep(Communicator& world, const Batch& batch, const EpLayers& layers, std::int64_t t, int runs) {
  const Device device = layers.plain->device();
  const MoEConfig& c = batch.whole;
  const auto [hidden, logits] = batch.make(t);
  DeviceTensor d_hidden(DType::bf16, {t, c.hidden_size}, device), d_logits(DType::f32, {t, c.num_experts}, device);
  DeviceTensor d_out(DType::bf16, {t, c.hidden_size}, device);
  d_hidden.copy_from(rows_of(hidden.view(), world.rank() * t, t));
  d_logits.copy_from(rows_of(logits.view(), world.rank() * t, t));
  auto forward = [&](Layer& l) {
    l.forward(FusedArgs{d_hidden.view(), d_logits.view(), d_out.view(), {}, {}});
    synchronize(device);
  };
  RankRow row;
  row.layer_ms = median_ms(world, runs, [&] { forward(*layers.plain); });
  std::vector<double> dispatch, combine;
  for (int i = 0; i < runs + 2; ++i) {
    forward(*layers.profiled);
    const EpStats s = layers.profiled->ep_stats();
    if (i < 2) continue;
    dispatch.push_back(s.dispatch_ms);
    combine.push_back(s.combine_ms);
    row.dispatch_remote_bytes = double(s.dispatch_remote_bytes);
    row.combine_remote_bytes = double(s.combine_remote_bytes);
  }
  row.dispatch_ms = median(dispatch);
  row.combine_ms = median(combine);
  measure_fixed(world, layers, FusedArgs{d_hidden.view(), d_logits.view(), d_out.view(), {}, {}}, runs, row);
  Case k;
  k.tokens = t;
  k.ranks.resize(std::size_t(world.size()));
  world.all_gather(&row, k.ranks.data(), sizeof row, nullptr);
  return k;
}

// Wall-clock median ms of the single-device layer on the whole batch of a case.
double single_device_ms(Layer& single, const Batch& batch, std::int64_t tokens_per_rank, int runs) {
  const Device device = single.device();
  const MoEConfig& c = batch.whole;
  const auto [hidden, logits] = batch.make(tokens_per_rank);
  const std::int64_t total = hidden.size(0);
  DeviceTensor d_hidden(DType::bf16, {total, c.hidden_size}, device), d_logits(DType::f32, {total, c.num_experts}, device);
  DeviceTensor d_out(DType::bf16, {total, c.hidden_size}, device);
  d_hidden.copy_from(hidden.view());
  d_logits.copy_from(logits.view());
  std::vector<double> ms;
  for (int i = 0; i < runs + 2; ++i) {
    const auto start = Clock::now();
    single.forward(FusedArgs{d_hidden.view(), d_logits.view(), d_out.view(), {}, {}});
    synchronize(device);
    if (i >= 2) ms.push_back(ms_since(start));
  }
  return median(ms);
}

int bench_ranks(const Args& args, int local_rank, Communicator& world, std::chrono::milliseconds timeout) {
  const int n = world.size(), rank = world.rank();
  const std::string preset = args.get("preset", "");
  if (preset.empty() || preset.find(',') != std::string::npos) throw UsageError("--ep: give one --preset NAME");
  MoEConfig whole = io::with_shared(io::find_preset(preset), shared_experts_of(args));
  if (args.has("quant")) whole.quant.scheme = parse_quant_scheme(args.get("quant", ""), "--quant");
  MoEConfig mine = whole;
  mine.ep_size = n;
  mine.ep_rank = rank;
  validate(mine);
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));
  const std::vector<float> skew_bias = skew_bias_of(args, whole.num_experts, seed);  // checked before generating
  const std::vector<std::int64_t> token_list = args.get_int_list("tokens", "128,4096", 1, 1 << 20);
  const std::string backend = select_backend(mine, args.get("backend", "auto")).chosen;
  const Device device = backend == "cpu" ? Device::cpu : Device::cuda;
  const int runs = int(args.get_int("runs", device == Device::cuda ? 20 : 3, 1, 10000));
  std::unique_ptr<Communicator> nccl;
  if (device == Device::cuda) nccl = make_nccl_communicator(world, local_rank, {timeout});
  Communicator& comm = nccl ? *nccl : world;

  std::vector<EpCombine> combines;
  for (const std::string& name : args.get_list("ep-combine", "auto")) {
    if (name == "exact") combines.push_back(EpCombine::exact);
    else if (name == "partial") combines.push_back(EpCombine::partial);
    else if (name == "auto") combines.push_back(EpCombine::automatic);
    else throw UsageError("--ep-combine: expected auto|exact|partial[,...], given '" + name + "'");
  }
  if (rank == 0) std::fprintf(stderr, "bench --ep: generating each rank's experts...\n");
  const core::SyntheticLayer local = core::make_synthetic_layer(mine, seed);
  Link link;
  link.block = std::size_t(device == Device::cuda ? 256 : 16) << 20;
  link.gbs = link_gbs(comm, device, link.block);

  const Batch batch{whole, seed, n, skew_bias};
  std::vector<std::pair<EpCombine, std::vector<Case>>> results;
  for (const EpCombine combine : combines) {
    LayerOptions options;
    options.backend = backend;
    options.comm = &comm;
    options.ep.combine = combine;
    Layer layer(mine, local.weights(), options);
    options.ep.timing = EpTiming::barriers;
    Layer profiled(mine, local.weights(), options);
    std::vector<Case> cases;
    for (std::int64_t t : token_list) {
      if (rank == 0)
        std::fprintf(stderr, "bench --ep: combine %s, T=%lld per rank...\n", std::string(to_string(combine)).c_str(),
                     static_cast<long long>(t));
      LayerOptions fixed_options = options;
      fixed_options.ep.timing = EpTiming::plain;
      fixed_options.ep.capacity = t;
      Layer fixed(mine, local.weights(), fixed_options);
      cases.push_back(measure_ep(world, batch, {&layer, &profiled, &fixed, &comm}, t, runs));
    }
    results.emplace_back(layer.ep_combine(), cases);
  }

  // Rank 0 alone: the single-device layer over the whole batch of each case.
  if (rank == 0) {
    std::fprintf(stderr, "bench --ep: the single-device layer (every expert) on rank 0...\n");
    const core::SyntheticLayer all = core::make_synthetic_layer(whole, seed);
    LayerOptions single_options;
    single_options.backend = backend;
    Layer single(whole, all.weights(), single_options);
    for (std::size_t i = 0; i < token_list.size(); ++i) {
      const double ms = single_device_ms(single, batch, token_list[i], runs);
      for (auto& [combine, cases] : results) cases[i].single_ms = ms;
    }
    for (const auto& [combine, cases] : results) print_cases(mine, preset, comm, combine, link, cases);
  }
  world.barrier(nullptr);
  return 0;
}

}  // namespace

int cmd_bench_ep(const Args& args) {
  const int ep = int(args.get_int("ep", 1, 1, 1 << 16));
  for (const char* flag : {"inputs", "name", "json", "stages", "graph", "routing"})
    if (args.has(flag)) throw UsageError(std::string("--") + flag + ": not with --ep");
  // Rank 0 builds the single-device layer while the others wait: a long timeout.
  const std::chrono::milliseconds timeout = std::chrono::seconds(1800);
  require_mpi_launch(ep, "bench");
  MpiSession mpi(nullptr, nullptr);
  std::unique_ptr<Communicator> world = make_mpi_communicator({timeout});
  const int rank = world->rank();
  try {
    return bench_ranks(args, mpi.local_rank(), *world, timeout);
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "moekit bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit bench: error: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace moekit::cli
