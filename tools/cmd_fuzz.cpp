// `moekit fuzz`: the differential campaign of issue #19 (docs/FUZZ.md). Draws random problems
// (fuzz_case.h), runs each on the backend under test against the CPU references and judges it
// (fuzz_run.h): one line per case with its seed, a summary last, optionally JSON.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "bench_json.h"
#include "cli_args.h"
#include "commands.h"
#include "fuzz_run.h"
#include "git_commit.h"
#include "moekit/device.h"
#include "moekit/moekit.h"

namespace moekit::cli {
namespace {

using fuzz::Case;
using fuzz::Outcome;

constexpr std::int64_t kMaxSeed = std::int64_t(1) << 62;

std::string backend_of(const Args& args) {
  const std::string name = args.get("backend", "auto");
  if (name == "auto") return cuda_available() ? "cuda" : "cpu";
  std::string known = "auto";
  for (const std::string& b : backend_names()) {
    if (b == name) return name;
    known += "|" + b;
  }
  throw UsageError("--backend: expected one of " + known + ", given '" + name + "'");
}

// "fp8-block/fast", "bf16": what the check's bounds depend on.
std::string mode_of(const Case& c) {
  const QuantConfig& q = c.config.quant;
  std::string s(to_string(q.scheme));
  return q.scheme == QuantScheme::bf16 ? s : s + "/" + std::string(to_string(q.accumulation));
}

// The largest figures of the passing and failing valid cases of one mode, against their bounds.
struct Tally {
  std::int64_t cases = 0, failed = 0;
  double worst_global = 0.0;  // rel_err / tolerance
  double worst_ideal_ratio = 0.0, worst_row = 0.0;

  void add(const Outcome& o) {
    ++cases;
    failed += !o.pass();
    if (!o.check) return;
    const core::CheckResult& r = *o.check;
    if (std::isfinite(r.rel_err)) worst_global = std::max(worst_global, r.rel_err / r.tolerance);
    if (r.has_ideal && r.q > 0 && std::isfinite(r.ideal_ratio)) worst_ideal_ratio = std::max(worst_ideal_ratio, r.ideal_ratio);
    if (std::isfinite(r.worst_row)) worst_row = std::max(worst_row, r.worst_row);
  }
};

struct Campaign {
  std::string backend;
  std::uint64_t seed = 0;
  std::int64_t requested = 0, run = 0, valid = 0, failed = 0;
  bool stopped_by_time = false;
  bool device_lost = false;  // a case broke the device: the campaign stopped there
  double seconds = 0.0;
  std::map<std::string, Tally> modes;          // valid cases
  std::map<std::string, std::int64_t> rules;   // failed checks, by name
  std::vector<std::string> failures;           // their lines
  std::vector<std::uint64_t> failed_seeds;
};

// After an error on a GPU: whether the device still works. A fault in a kernel (an illegal
// address, say) leaves the CUDA context broken, and every case after it would fail for that.
bool device_works(const std::string& backend) {
  if (backend == "cpu") return true;
  try {
    Tensor one(DType::f32, {1});
    one.ptr<float>()[0] = 1.0f;
    DeviceTensor t(DType::f32, {1}, Device::cuda);
    t.copy_from(one.view());
    synchronize(Device::cuda);
    t.copy_to(one.view());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string verdict(const Outcome& o) {
  if (o.pass()) return "PASS";
  std::string s = "FAIL [";
  for (std::size_t i = 0; i < o.failed.size(); ++i) s += (i ? ", " : "") + o.failed[i];
  return s + "]";
}

std::string case_line(std::int64_t index, const Case& c, const Outcome& o, double ms) {
  char head[96];
  std::snprintf(head, sizeof head, "case %lld seed=%llu %.0f ms ", static_cast<long long>(index),
                static_cast<unsigned long long>(c.seed), ms);
  return head + verdict(o) + " | " + c.to_string() + " | " + o.details;
}

void write_json(const std::string& path, const Campaign& k) {
  std::ostringstream j;
  j << "{\"moekit_version\": " << json_string(std::string(version())) << ", \"git_commit\": " << json_string(MOEKIT_GIT_COMMIT)
    << ", \"backend\": " << json_string(k.backend) << ", \"seed\": " << k.seed << ", \"cases_requested\": " << k.requested
    << ", \"cases_run\": " << k.run << ", \"valid\": " << k.valid << ", \"invalid\": " << k.run - k.valid
    << ", \"passed\": " << k.run - k.failed << ", \"failed\": " << k.failed
    << ", \"stopped_by_time_limit\": " << (k.stopped_by_time ? "true" : "false")
    << ", \"device_lost\": " << (k.device_lost ? "true" : "false") << ", \"seconds\": " << json_number(k.seconds)
    << ",\n \"failed_checks\": {";
  bool first = true;
  for (const auto& [rule, n] : k.rules) j << (first ? "" : ", ") << json_string(rule) << ": " << n, first = false;
  j << "},\n \"modes\": {";
  first = true;
  for (const auto& [mode, t] : k.modes) {
    j << (first ? "\n  " : ",\n  ") << json_string(mode) << ": {\"cases\": " << t.cases << ", \"failed\": " << t.failed
      << ", \"worst_global_over_tolerance\": " << json_number(t.worst_global)
      << ", \"worst_ideal_ratio\": " << json_number(t.worst_ideal_ratio) << ", \"worst_row\": " << json_number(t.worst_row) << "}";
    first = false;
  }
  j << "},\n \"failures\": [";
  for (std::size_t i = 0; i < k.failures.size(); ++i)
    j << (i ? ",\n  " : "\n  ") << "{\"seed\": " << k.failed_seeds[i] << ", \"line\": " << json_string(k.failures[i]) << "}";
  j << "\n]}\n";
  std::ofstream out(path);
  out << j.str();
  if (!out) throw Error("--json: cannot write " + path);
}

void print_summary(const Campaign& k) {
  std::printf("\nfuzz summary: %lld cases (%lld valid, %lld invalid) on %s, seed %llu, %.1f s%s\n",
              static_cast<long long>(k.run), static_cast<long long>(k.valid), static_cast<long long>(k.run - k.valid),
              k.backend.c_str(), static_cast<unsigned long long>(k.seed), k.seconds,
              k.stopped_by_time ? (" (stopped by --time-limit; " + std::to_string(k.requested) + " asked)").c_str() : "");
  std::printf("  %-22s %7s %7s %12s %12s %10s\n", "mode", "cases", "failed", "global/tol", "ideal_ratio", "worst_row");
  for (const auto& [mode, t] : k.modes)
    std::printf("  %-22s %7lld %7lld %12.4g %12.6g %10.3g\n", mode.c_str(), static_cast<long long>(t.cases),
                static_cast<long long>(t.failed), t.worst_global, t.worst_ideal_ratio, t.worst_row);
  if (k.failed == 0) {
    std::printf("fuzz: PASS %lld cases, 0 failed\n", static_cast<long long>(k.run));
    return;
  }
  std::string rules;
  for (const auto& [rule, n] : k.rules) rules += (rules.empty() ? "" : ", ") + rule + " " + std::to_string(n);
  std::printf("failed cases (replay one: moekit fuzz --backend %s --replay SEED):\n", k.backend.c_str());
  for (std::size_t i = 0; i < std::min<std::size_t>(k.failures.size(), 20); ++i) std::printf("  %s\n", k.failures[i].c_str());
  std::printf("fuzz: FAIL %lld of %lld cases [%s]\n", static_cast<long long>(k.failed), static_cast<long long>(k.run),
              rules.c_str());
}

// Names the case in flight when it runs past `seconds` (a hung kernel, a runaway case) and ends
// the process with exit 3: a campaign killed from outside would leave no trace of which case it was.
class CaseWatch {
 public:
  CaseWatch(double seconds, std::string backend) : seconds_(seconds), backend_(std::move(backend)) {
    if (seconds_ > 0) thread_ = std::thread([this] { watch(); });
  }
  ~CaseWatch() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  CaseWatch(const CaseWatch&) = delete;
  CaseWatch& operator=(const CaseWatch&) = delete;

  void begin(std::int64_t index, std::uint64_t seed) {
    const std::lock_guard<std::mutex> lock(mutex_);
    index_ = index, seed_ = seed, started_ = std::chrono::steady_clock::now(), running_ = true;
  }
  void end() {
    const std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      wake_.wait_for(lock, std::chrono::seconds(1));
      if (done_ || !running_) continue;
      const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      if (ran < seconds_) continue;
      std::printf("fuzz: case %lld seed=%llu has run %.0f s (--case-timeout %.0f): a hung kernel or a runaway case; "
                  "replay it with moekit fuzz --backend %s --replay %llu\n",
                  static_cast<long long>(index_), static_cast<unsigned long long>(seed_), ran, seconds_, backend_.c_str(),
                  static_cast<unsigned long long>(seed_));
      std::fflush(stdout);
      std::_Exit(3);
    }
  }

  double seconds_;
  std::string backend_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false, running_ = false;
  std::int64_t index_ = 0;
  std::uint64_t seed_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

int replay(std::uint64_t seed, const fuzz::Target& target) {
  const Case c = fuzz::draw_case(seed, target);
  const auto start = std::chrono::steady_clock::now();
  const Outcome o = fuzz::run_case(c, target);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s\n", case_line(0, c, o, ms).c_str());
  std::printf("  backend %s; %s\n", target.backend.c_str(),
              c.valid() ? ("rule (DESIGN §8): " + core::check_rule_text(c.config.quant)).c_str()
                        : ("must be refused, the message beginning '" + std::string(fuzz::argument_of(c.breaks)) + ":'").c_str());
  if (o.check) std::printf("check: %s\n", o.check->to_string().c_str());
  std::printf("fuzz: %s\n", verdict(o).c_str());
  return o.pass() ? 0 : 1;
}

}  // namespace

int cmd_fuzz(int argc, char** argv) {
  const std::vector<Flag> flags{
      {"cases", true, "number of cases (default 1000)"},
      {"seed", true, "seed of the campaign: case i has seed case_seed(seed, i) (default 1)"},
      {"replay", true, "run the one case of this seed (printed on each case line), with its details"},
      {"backend", true, "auto|cpu|cuda: the backend under test (auto: cuda when a GPU is there, else cpu)"},
      {"time-limit", true, "seconds: start no case after this (default: none)"},
      {"case-timeout", true, "seconds: a case still running after this is named and the campaign ends, exit 3 (default 60; 0: none)"},
      {"json", true, "write the summary (counts, worst figures per mode, failed cases) to this file"},
      {"failures-only", false, "print the lines of failed cases only (and the summary)"},
      {"help", false, "this text"},
  };
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("fuzz", flags).c_str());
    std::printf("Draws random valid problems (routing x logits dtype x quant x scale format x activation x FP8\n"
                "accumulation x fused/external x EP-local experts x experts path; T 0..20000, E up to 512, NaN/Inf\n"
                "logits, -1 ids, |x| up to 1e4, weight scales 1e-23..1e3) and checks each against the CPU pipeline\n"
                "and ideal references under DESIGN §8; about 5%% break one argument and must be refused by name.\n");
    return 0;
  }
  const fuzz::Target target = fuzz::Target::of(backend_of(args));
  if (args.has("replay")) {
    for (const char* flag : {"cases", "seed", "time-limit", "case-timeout", "json", "failures-only"})
      if (args.has(flag)) throw UsageError(std::string("--replay: runs one case; drop --") + flag);
    return replay(std::uint64_t(args.get_int("replay", 0, 0, kMaxSeed)), target);
  }
  Campaign k;
  k.backend = target.backend;
  k.seed = std::uint64_t(args.get_int("seed", 1, 0, kMaxSeed));
  k.requested = args.get_int("cases", 1000, 0, std::int64_t(1) << 40);
  const double limit = double(args.get_int("time-limit", 0, 0, std::int64_t(1) << 31));
  const bool failures_only = args.has("failures-only");
  CaseWatch watch(double(args.get_int("case-timeout", 60, 0, std::int64_t(1) << 31)), k.backend);
  std::printf("moekit fuzz: %lld cases on %s, seed %llu%s\n", static_cast<long long>(k.requested), k.backend.c_str(),
              static_cast<unsigned long long>(k.seed), limit > 0 ? (", time limit " + std::to_string(int(limit)) + " s").c_str() : "");
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (std::int64_t i = 0; i < k.requested; ++i) {
    if (limit > 0 && elapsed() >= limit) {
      k.stopped_by_time = true;
      break;
    }
    const Case c = fuzz::draw_case(fuzz::case_seed(k.seed, i), target);
    const double case_start = elapsed();
    watch.begin(i, c.seed);
    const Outcome o = fuzz::run_case(c, target);
    watch.end();
    const std::string line = case_line(i, c, o, 1e3 * (elapsed() - case_start));
    ++k.run;
    if (c.valid()) ++k.valid, k.modes[mode_of(c)].add(o);
    if (!o.pass()) {
      ++k.failed;
      for (const std::string& rule : o.failed) ++k.rules[rule];
      k.failures.push_back(line);
      k.failed_seeds.push_back(c.seed);
    }
    if (!failures_only || !o.pass()) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    if (std::find(o.failed.begin(), o.failed.end(), "error") != o.failed.end() && !device_works(k.backend)) {
      std::printf("fuzz: the %s device no longer works after case %lld (seed %llu): the cases after it were not run\n",
                  k.backend.c_str(), static_cast<long long>(i), static_cast<unsigned long long>(c.seed));
      k.device_lost = true;
      break;
    }
  }
  k.seconds = elapsed();
  print_summary(k);
  if (args.has("json")) write_json(args.get("json", ""), k);
  return k.failed == 0 ? 0 : 1;
}

}  // namespace moekit::cli
