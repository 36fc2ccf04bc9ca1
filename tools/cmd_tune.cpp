// `moekit tune`: measured tactic choice for the GPU Experts step (docs/TUNE.md).
//   per problem (a preset's synthetic layer or a layer file) and token bucket: every candidate
//   tactic (src/cuda/layer/tactic.h) timed in the whole layer (fused routing from the generator's
//   or the file's logits), side by side: a CUDA graph per tactic, --runs rounds that replay each
//   once with the L2 evicted before each replay (256 MiB read, outside the timed events), the
//   median per tactic; with --skew, the same rounds again on each skewed routing of the inputs and
//   the geometric mean of the medians; the winner and its runners-up go to the cache (--out, merged
//   with what it holds). --verify re-times a cache's entries instead.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/common/evict.h"
#include "cuda/layer/tactic.h"
#endif

#include "commands.h"
#include "core/synthetic.h"
#include "core/tune.h"
#include "core/tuning.h"
#include "io/layer_file.h"
#include "io/presets.h"
#include "run_setup.h"

namespace moekit::cli {
namespace {

constexpr const char* kBuckets = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384";
#ifdef MOEKIT_HAVE_CUDA  // the tuner itself: without CUDA, cmd_tune checks its flags and refuses
// A runner-up that is now this much faster than the cached winner makes --verify fail.
constexpr double kStaleMargin = 0.03;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One layer to tune: a preset's synthetic weights and inputs, or a layer file's.
struct TuneProblem {
  std::string name;
  MoEConfig config;
  std::uint64_t seed = 0;
  std::optional<core::SyntheticLayer> synthetic;
  std::optional<io::LayerFile> file;
  // --skew: the routings each tactic is timed on (a preset's generated logits plus each one's bias;
  // a file: its own logits, none).
  std::vector<core::RouterSkew> skews{core::RouterSkew{}};

  Weights weights() const { return file ? file->weights() : synthetic->weights(); }

  // hidden [T, H] bf16 and router_logits [T, E] per skew: generated, or the file's rows taken in turn.
  std::pair<Tensor, std::vector<Tensor>> inputs(std::int64_t tokens) const {
    std::vector<Tensor> logits;
    if (file) {
      logits.push_back(cycled(file->router_logits, tokens));
      return {cycled(file->hidden, tokens), std::move(logits)};
    }
    const Tensor generated = core::make_router_logits(tokens, config.num_experts, DType::f32, seed + 100);
    for (const core::RouterSkew& skew : skews) {
      logits.push_back(cycled(generated, tokens));  // a copy
      core::add_router_bias(logits.back().view(), core::router_skew_bias(skew, config.num_experts, seed, "--skew"));
    }
    return {core::make_hidden(tokens, config.hidden_size, seed + 100), std::move(logits)};
  }

  std::string measured(int runs) const {
    std::string routings;
    for (const core::RouterSkew& skew : skews) routings += (routings.empty() ? "" : ", ") + skew.to_string();
    const std::string over = skews.size() > 1 ? "; the geometric mean over the skews " + routings
                             : skews.front().kind != core::SkewKind::none ? "; skew " + routings
                                                                        : "";
    return name + ", routing " + std::string(to_string(config.routing.method)) + ", median of " + std::to_string(runs) +
           " CUDA-graph replays interleaved with the other tactics', cold L2" + over + ", moekit tune";
  }

  static Tensor cycled(const Tensor& t, std::int64_t count) {
    Tensor out(t.dtype(), {count, t.size(1)});
    const std::size_t row = std::size_t(t.size(1)) * dtype_size(t.dtype());
    for (std::int64_t r = 0; r < count; ++r)
      std::memcpy(out.ptr<std::byte>() + std::size_t(r) * row, t.ptr<std::byte>() + std::size_t(r % t.size(0)) * row, row);
    return out;
  }
};

TuneProblem preset_problem(const std::string& name, const Args& args, std::uint64_t seed) {
  TuneProblem p;
  p.name = name;
  p.seed = seed;
  p.config = io::find_preset(name).config;
  if (args.has("quant")) p.config.quant.scheme = parse_quant_scheme(args.get("quant", ""), "--quant");
  apply_run_options(p.config, args);
  std::fprintf(stderr, "tune: %s: generating weights...\n", name.c_str());
  p.synthetic = core::make_synthetic_layer(p.config, seed);
  return p;
}

TuneProblem file_problem(const std::string& path, const Args& args) {
  TuneProblem p;
  std::fprintf(stderr, "tune: reading %s...\n", path.c_str());
  p.file = io::read_layer_file(path);
  if (!p.file->router_logits.defined() || p.file->hidden.size(0) == 0)
    throw UsageError("--inputs: the tuner routes from router_logits; " + path + " has none");
  p.config = p.file->config;
  apply_run_options(p.config, args);
  p.name = path.substr(path.find_last_of('/') + 1);
  return p;
}

// On a terminal one line redrawn; in a log one line per bucket.
class ProgressBar {
 public:
  explicit ProgressBar(std::string name) : name_(std::move(name)), tty_(::isatty(2) == 1), start_(Clock::now()) {}
  void operator()(std::size_t done, std::size_t total, std::int64_t tokens, const std::string& what) {
    const double elapsed = seconds_since(start_), eta = done ? elapsed / double(done) * double(total - done) : 0;
    if (tty_) {
      const int width = 30, filled = total ? int(double(width) * double(done) / double(total)) : width;
      std::fprintf(stderr, "\r\033[Ktune %s [%s%s] %zu/%zu T=%lld %s, %.0f s, eta %.0f s", name_.c_str(),
                   std::string(std::size_t(filled), '#').c_str(), std::string(std::size_t(width - filled), '.').c_str(),
                   done, total, static_cast<long long>(tokens), what.c_str(), elapsed, eta);
    } else if (tokens != last_) {
      std::fprintf(stderr, "tune %s: T=%lld (%zu/%zu measured, %.0f s, eta %.0f s)\n", name_.c_str(),
                   static_cast<long long>(tokens), done, total, elapsed, eta);
    }
    last_ = tokens;
    measured_ = done + 1;
  }
  void finish() const {
    std::fprintf(stderr, "%stune %s: %zu measurements in %.1f s\n", tty_ ? "\r\033[K" : "", name_.c_str(), measured_,
                 seconds_since(start_));
  }

 private:
  std::string name_;
  bool tty_;
  Clock::time_point start_;
  std::int64_t last_ = -1;
  std::size_t measured_ = 0;
};

// The cache of one entry that makes a layer run `tactic` at T (how the tuner forces a tactic:
// through the same lookup a tuned layer makes).
std::string forcing_cache(const io::TuningDevice& device, const MoEConfig& config, std::int64_t tokens,
                          const std::string& tactic) {
  io::TuningEntry e;
  e.device = device;
  e.problem = io::TuningProblem::of(config);
  e.tokens = config.batch_invariant ? 0 : io::token_bucket(tokens);
  e.winner = {tactic, 1};
  io::TuningCache cache;
  cache.entries.push_back(e);
  return io::write_tuning_cache(cache);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("tune: ") + what + ": " + cudaGetErrorString(e));
}

// Larger than the L2 (50 MB on the H100/H200), read before each replay (cuda::evict_l2: clean lines;
// the memset used before left dirty ones, whose write-backs the timed run paid).
constexpr std::size_t kFlushBytes = std::size_t(256) << 20;

class GpuTimer final : public core::TacticTimer {
 public:
  GpuTimer(const TuneProblem& problem, const PreparedWeights& prepared, int runs)
      : problem_(problem), prepared_(prepared), runs_(runs), device_(cuda::this_device()),
        flush_(DType::u8, {std::int64_t(kFlushBytes)}, Device::cuda) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMemsetAsync(flush_.view().data, 0x5a, kFlushBytes, stream_), "flush");  // read, never uninitialized
    events_.resize(std::size_t(2 * runs));
    for (cudaEvent_t& e : events_) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~GpuTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  const io::TuningDevice& device() const { return device_; }

  // One Layer and CUDA graph per tactic over one workspace (the graphs run one after another on one
  // stream), then --runs rounds: each replays every graph once after an L2 eviction, starting one graph
  // later than the round before.
  std::vector<double> time_us(std::int64_t tokens, const std::vector<std::string>& tactics) override {
    const MoEConfig& c = problem_.config;
    std::vector<std::unique_ptr<Layer>> layers;
    std::size_t bytes = 1;
    for (const std::string& tactic : tactics) {
      LayerOptions options;
      options.tuning.cache = "tactic " + tactic;
      options.tuning.json = forcing_cache(device_, c, tokens, tactic);
      // The same lookup the layer makes: the entry must be taken (not a fallback to the heuristic).
      const cuda::TacticChooser chooser(c, core::load_tuning(options.tuning, device_), device_);
      const cuda::TacticChoice choice = chooser.choose({c, tokens, 0, false});
      require(choice.tuned != nullptr, "tune: " + tactic + " at T=" + std::to_string(tokens) + ": " + choice.reason);
      layers.push_back(std::make_unique<Layer>(prepared_, options));
      bytes = std::max(bytes, layers.back()->workspace_size(tokens));
    }
    Inputs& in = inputs(tokens);
    const FusedArgs args{in.hidden.view(), in.logits.view(), in.out.view(), {}, {}};
    DeviceTensor workspace(DType::u8, {std::int64_t(bytes)}, Device::cuda);
    const Workspace ws{workspace.view().data, bytes};
    Graphs graphs;
    for (const std::unique_ptr<Layer>& layer : layers) {
      layer->forward(args, ws, stream_);
      cudaGraph_t graph;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "capture");
      layer->forward(args, ws, stream_);
      check(cudaStreamEndCapture(stream_, &graph), "capture");
      cudaGraphExec_t exec;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      check(made, "cudaGraphInstantiate");
      graphs.execs.push_back(exec);
      for (int w = 0; w < 2; ++w) check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    }
    const std::size_t n = tactics.size();
    events_.resize(std::max(events_.size(), 2 * n * std::size_t(runs_)));
    for (cudaEvent_t& e : events_)
      if (!e) check(cudaEventCreate(&e), "cudaEventCreate");
    // Per routing (the first already in place): its logits, a warm-up replay of every graph, the
    // rounds; a tactic's time is the geometric mean of its medians.
    std::vector<std::vector<double>> per_routing;
    for (std::size_t s = 0; s < in.routings.size(); ++s) {
      if (s > 0) {
        in.logits.copy_from(in.routings[s].view());
        check(cudaDeviceSynchronize(), "the logits");  // a pageable copy may return before it lands
        for (cudaGraphExec_t exec : graphs.execs) check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
      }
      for (int r = 0; r < runs_; ++r)
        for (std::size_t j = 0; j < n; ++j) {
          const std::size_t i = (j + std::size_t(r)) % n, at = 2 * (std::size_t(r) * n + i);
          cuda::evict_l2(flush_.view().data, kFlushBytes, stream_);
          cudaEventRecord(events_[at], stream_);
          check(cudaGraphLaunch(graphs.execs[i], stream_), "cudaGraphLaunch");
          cudaEventRecord(events_[at + 1], stream_);
        }
      check(cudaStreamSynchronize(stream_), "the layer");
      std::vector<double>& medians = per_routing.emplace_back();
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> us;
        for (int r = 0; r < runs_; ++r) {
          const std::size_t at = 2 * (std::size_t(r) * n + i);
          float ms = 0;
          check(cudaEventElapsedTime(&ms, events_[at], events_[at + 1]), "events");
          us.push_back(double(ms) * 1e3);
        }
        std::sort(us.begin(), us.end());
        medians.push_back(us[us.size() / 2]);
      }
    }
    if (in.routings.size() > 1) {
      in.logits.copy_from(in.routings.front().view());
      check(cudaDeviceSynchronize(), "the logits");
    }
    return core::geometric_means(per_routing);
  }

 private:
  struct Inputs {
    DeviceTensor hidden, logits, out;
    std::vector<Tensor> routings;  // the logits of each skew (host), the first in `logits`
  };
  // The instantiated graphs of one measurement, destroyed with it.
  struct Graphs {
    std::vector<cudaGraphExec_t> execs;
    Graphs() = default;
    Graphs(const Graphs&) = delete;
    Graphs& operator=(const Graphs&) = delete;
    ~Graphs() {
      for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
    }
  };
  Inputs& inputs(std::int64_t tokens) {
    if (tokens_ != tokens) {
      const MoEConfig& c = problem_.config;
      auto [h, l] = problem_.inputs(tokens);
      inputs_.reset();
      const Tensor& first = l.front();
      inputs_.emplace(Inputs{DeviceTensor(h.dtype(), h.shape(), Device::cuda), DeviceTensor(first.dtype(), first.shape(), Device::cuda),
                             DeviceTensor(DType::bf16, {tokens, c.hidden_size}, Device::cuda), std::move(l)});
      inputs_->hidden.copy_from(h.view());
      inputs_->logits.copy_from(first.view());
      tokens_ = tokens;
    }
    return *inputs_;
  }

  const TuneProblem& problem_;
  const PreparedWeights& prepared_;
  int runs_;
  io::TuningDevice device_;
  DeviceTensor flush_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::optional<Inputs> inputs_;
  std::int64_t tokens_ = -1;
};

core::TunePlan make_plan(const TuneProblem& p, const io::TuningDevice& device, const std::vector<std::int64_t>& buckets,
                         int runs) {
  core::TunePlan plan;
  plan.device = device;
  plan.problem = io::TuningProblem::of(p.config);
  plan.measured = p.measured(runs);
  for (std::int64_t t : buckets) {
    core::TuneCase c{t, {}, {}};
    const cuda::TacticProblem problem{p.config, t, 0, false};
    for (const cuda::Tactic& tactic : cuda::candidate_tactics(problem)) {
      c.tactics.push_back(tactic.name());
      for (const cuda::Tactic& variant : cuda::tactic_variants(tactic, problem)) c.variants[tactic.name()].push_back(variant.name());
    }
    plan.cases.push_back(c);
  }
  return plan;
}

void print_results(const TuneProblem& p, const core::TunePlan& plan, const std::vector<io::TuningEntry>& entries) {
  std::printf("tune %s (%s): at most %zu measurements\n", p.name.c_str(), plan.problem.to_string().c_str(), plan.measurements());
  std::printf("  %6s  %-52s %10s  %-52s %10s %7s\n", "T", "heuristic", "us", "tuned", "us", "gain");
  for (const io::TuningEntry& e : entries) {
    // The heuristic's tactic is each case's first candidate.
    std::string heuristic;
    for (const core::TuneCase& c : plan.cases)
      if (c.tokens == e.tokens || e.tokens == 0) heuristic = c.tactics.front();
    double heuristic_us = e.winner.us;
    for (const io::TunedTime& r : e.runners_up)
      if (r.tactic == heuristic) heuristic_us = r.us;
    const std::string t = e.tokens == 0 ? "all" : std::to_string(e.tokens);
    std::printf("  %6s  %-52s %10.1f  %-52s %10.1f %6.1f%%%s\n", t.c_str(), heuristic.c_str(), heuristic_us,
                e.winner.tactic.c_str(), e.winner.us, 100.0 * (heuristic_us - e.winner.us) / heuristic_us,
                e.winner.tactic == heuristic ? "" : "  (changed)");
  }
  for (const core::TuneCase& c : plan.cases)
    if (c.tactics.size() <= 1 && !plan.problem.batch_invariant)
      std::printf("  %6lld  %s: the only tactic that can run, not timed\n", static_cast<long long>(c.tokens),
                  c.tactics.empty() ? "none" : c.tactics.front().c_str());
  std::fflush(stdout);
}

// Writes the cache next to its final name, then renames it over (a reader never sees half a file).
void write_cache(const std::string& path, const std::vector<io::TuningEntry>& entries) {
  io::TuningCache cache;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    try {
      cache = io::read_tuning_cache(path);
    } catch (const Error& e) {
      std::fprintf(stderr, "tune: %s is not a cache this moekit reads (%s): replaced\n", path.c_str(), e.what());
    }
  }
  io::merge_tuning_entries(cache, entries);
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string temporary = path + ".tmp";
  std::FILE* f = std::fopen(temporary.c_str(), "wb");
  require(f != nullptr, "--out: cannot write " + temporary);
  const std::string text = io::write_tuning_cache(cache);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  require(std::fclose(f) == 0 && written, "--out: cannot write " + temporary);
  std::filesystem::rename(temporary, target);
  std::printf("tune: wrote %zu entries to %s (%zu in all)\n", entries.size(), path.c_str(), cache.entries.size());
}

// Each tuned entry of the cache for this problem: its tactic must run, and no runner-up may now
// beat it by more than kStaleMargin. Returns the number of failures.
int verify(const TuneProblem& p, const std::string& file, const std::vector<std::int64_t>& buckets, GpuTimer& timer) {
  TuningOptions options;
  options.cache = file;
  const core::TuningSource source = core::load_tuning(options, timer.device());
  const io::TuningProblem key = io::TuningProblem::of(p.config);
  const core::TunedTable matching(source, timer.device(), key, "experts");
  const cuda::TacticChooser chooser(p.config, source, timer.device());
  std::printf("verify %s (%s)\n", p.name.c_str(), key.to_string().c_str());
  for (const std::string& line : chooser.table().report()) std::printf("  %s\n", line.c_str());
  int failures = source.cache ? 0 : 1;
  std::vector<std::int64_t> seen;
  for (std::int64_t t : buckets) {
    const io::TuningEntry* entry = matching.find(t);
    if (!entry || std::find(seen.begin(), seen.end(), entry->tokens) != seen.end()) {
      if (!entry) std::printf("  T=%-6lld no entry: the heuristic decides\n", static_cast<long long>(t));
      continue;
    }
    seen.push_back(entry->tokens);
    const cuda::TacticChoice choice = chooser.choose({p.config, t, 0, false});
    if (!choice.tuned) {
      std::printf("  T=%-6lld ERROR %s cannot run: %s\n", static_cast<long long>(t), entry->winner.tactic.c_str(),
                  choice.reason.c_str());
      ++failures;
      continue;
    }
    // The winner and the runners-up that can run here, side by side.
    std::vector<std::string> timed{entry->winner.tactic};
    for (const io::TunedTime& r : entry->runners_up) {
      const std::optional<cuda::Tactic> tactic = cuda::parse_tactic(r.tactic);
      if (tactic && cuda::can_implement(*tactic, {p.config, t, 0, false})) timed.push_back(r.tactic);
    }
    const std::vector<double> us = timer.time_us(t, timed);
    const double winner = us[0];
    std::string best;
    double best_us = winner;
    for (std::size_t i = 1; i < us.size(); ++i)
      if (us[i] < best_us) {
        best_us = us[i];
        best = timed[i];
      }
    const bool stale = best_us < winner * (1 - kStaleMargin);
    std::printf("  T=%-6lld %s %s %.1f us (cached %.1f)", static_cast<long long>(t), stale ? "STALE" : "ok",
                entry->winner.tactic.c_str(), winner, entry->winner.us);
    if (stale) std::printf(": %s now takes %.1f us, %.1f%% less", best.c_str(), best_us, 100 * (1 - best_us / winner));
    std::printf("\n");
    failures += stale;
  }
  return failures;
}
#endif

}  // namespace

int cmd_tune(int argc, char** argv) {
  const std::vector<Flag> flags = {
      {"preset", true, "preset[,preset...] (moekit presets): synthetic weights, routing from their logits"},
      {"inputs", true, "a layer file (DESIGN §2): its weights, and its rows (in turn) as each case's tokens"},
      {"tokens", true, std::string("the token buckets, powers of two (default ") + kBuckets + ")"},
      {"quant", true, "bf16|fp8-tensor|fp8-rowwise|fp8-block (default: each preset's)"},
      accumulation_flag(),
      batch_invariance_flag(),
      path_flag(),
      {"skew", true,
       "SPEC[,SPEC...] (none|zipf:ALPHA|hot:N:B, as moekit bench's): the routings each tactic is timed on, the "
       "presets' generated logits plus each one's bias; a tactic's time is the geometric mean of its medians "
       "(default none; e.g. none,zipf:1.2 so that the choice also holds when a few experts take most rows)"},
      {"runs", true, "timed replays per tactic (default 20, at least 20 for a cache)"},
      {"seed", true, "seed of weights and inputs (default 1)"},
      {"out", true, "the cache to write, merged with its entries (default $XDG_CACHE_HOME/moekit/tuning.json)"},
      {"verify", false, "re-time the cache's entries (--out, or --cache) instead: an entry that cannot run, or whose "
                        "runner-up now wins by > 3%, fails"},
      {"cache", true, "with --verify: the cache to check (default: --out's)"},
      {"help", false, "this text"},
  };
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("tune", flags).c_str());
    return 0;
  }
  if (!args.has("preset") && !args.has("inputs")) throw UsageError("give --preset NAME[,NAME...] or --inputs FILE");
  if (args.has("inputs") && (args.has("preset") || args.has("quant")))
    throw UsageError("--inputs: takes the layer and its inputs from the file; drop --preset/--quant");
  if (args.has("cache") && !args.has("verify")) throw UsageError("--cache: names the cache --verify checks; give --verify");
  if (args.has("inputs") && args.has("skew"))
    throw UsageError("--skew: biases generated router logits; a layer file's are its own: drop --skew");
  const std::vector<core::RouterSkew> skews = skews_of(args);
  const std::vector<std::int64_t> buckets = args.get_int_list("tokens", kBuckets, 1, io::kTuningMaxTokens);
  for (std::int64_t t : buckets)
    if (io::token_bucket(t) != t)
      throw UsageError("--tokens: expected powers of two (token buckets), given " + std::to_string(t));
  const int runs = int(args.get_int("runs", 20, 20, 10000));
  const auto seed = std::uint64_t(args.get_int("seed", 1, 0, std::int64_t(1) << 62));
  const std::string out = args.get("out", core::default_tuning_cache_path());
  if (out.empty()) throw UsageError("--out: no default path (neither XDG_CACHE_HOME nor HOME is set); give --out FILE");
#ifndef MOEKIT_HAVE_CUDA
  (void)runs;
  (void)seed;
  throw Error("tune: times the cuda backend's tactics; this moekit was built without CUDA");
#else
  if (!cuda_available()) throw Error("tune: needs a CUDA device (" + cuda::this_device().gpu + ")");
  std::vector<std::string> sources = args.has("inputs") ? std::vector<std::string>{args.get("inputs", "")}
                                                        : args.get_list("preset", "");
  std::vector<io::TuningEntry> entries;
  int failures = 0;
  for (const std::string& source : sources) {
    TuneProblem p = args.has("inputs") ? file_problem(source, args) : preset_problem(source, args, seed);
    if (!args.has("inputs")) {
      p.skews = skews;
      for (const core::RouterSkew& skew : skews) core::router_skew_bias(skew, p.config.num_experts, seed, "--skew");  // hot's N <= E
    }
    LayerOptions prepare;
    prepare.backend = "cuda";
    prepare.max_tokens = *std::max_element(buckets.begin(), buckets.end());
    const PreparedWeights prepared(p.config, p.weights(), prepare);
    GpuTimer timer(p, prepared, runs);
    if (args.has("verify")) {
      failures += verify(p, args.get("cache", out), buckets, timer);
      continue;
    }
    const core::TunePlan plan = make_plan(p, timer.device(), buckets, runs);
    std::fprintf(stderr, "tune %s: at most %zu measurements (%zu buckets, %d replays each)\n", p.name.c_str(), plan.measurements(),
                 buckets.size(), runs);
    ProgressBar bar(p.name);
    const std::vector<io::TuningEntry> tuned = core::tune(plan, timer, std::ref(bar));
    bar.finish();
    print_results(p, plan, tuned);
    entries.insert(entries.end(), tuned.begin(), tuned.end());
  }
  if (args.has("verify")) {
    std::printf("verify: %s\n", failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
  }
  write_cache(out, entries);
  return 0;
#endif
}

}  // namespace moekit::cli
