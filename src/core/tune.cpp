#include "core/tune.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "moekit/error.h"

namespace moekit::core {
namespace {

// Times to 0.01 µs: what the cache keeps (and writes back unchanged).
double rounded(double us) { return std::round(us * 100) / 100; }

io::TuningEntry entry_of(const TunePlan& plan, std::int64_t tokens, std::vector<io::TunedTime> times) {
  // Stable: on equal times the earlier candidate (the heuristic's first) stays ahead.
  const std::string heuristic = times.empty() ? std::string() : times.front().tactic;
  std::stable_sort(times.begin(), times.end(), [](const io::TunedTime& a, const io::TunedTime& b) { return a.us < b.us; });
  // The heuristic's tactic stays the winner unless another beats it by more than kTunedGain.
  const auto h = std::find_if(times.begin(), times.end(), [&](const io::TunedTime& t) { return t.tactic == heuristic; });
  if (h != times.end() && h->us <= times.front().us * (1.0 + kTunedGain)) std::rotate(times.begin(), h, h + 1);
  io::TuningEntry e;
  e.device = plan.device;
  e.problem = plan.problem;
  e.step = "experts";
  e.tokens = tokens;
  e.winner = times.front();
  // The fastest runners-up, as many as a cache may hold (the reader refuses more).
  e.runners_up.assign(times.begin() + 1, times.begin() + std::ptrdiff_t(std::min(times.size(), io::kTuningMaxRunnersUp + 1)));
  e.measured = plan.measured;
  return e;
}

}  // namespace

std::vector<double> geometric_means(const std::vector<std::vector<double>>& per_routing) {
  require(!per_routing.empty(), "tune: no routing timed");
  const std::size_t n = per_routing.front().size();
  std::vector<double> log_sum(n, 0.0);
  for (const std::vector<double>& medians : per_routing) {
    require(medians.size() == n, "tune: " + std::to_string(medians.size()) + " times for a routing, expected " + std::to_string(n));
    for (std::size_t t = 0; t < n; ++t) {
      require(medians[t] > 0, "tune: a tactic's median is " + std::to_string(medians[t]) + " us");
      log_sum[t] += std::log(medians[t]);
    }
  }
  if (per_routing.size() == 1) return per_routing.front();  // exactly as measured (exp(log x) may not be x)
  std::vector<double> means;
  for (double l : log_sum) means.push_back(std::exp(l / double(per_routing.size())));
  return means;
}

std::vector<TuneCase> TunePlan::timed() const {
  if (!problem.batch_invariant) {
    std::vector<TuneCase> out;
    for (const TuneCase& c : cases)
      if (c.tactics.size() > 1) out.push_back(c);
    return out;
  }
  if (cases.empty()) return {};
  std::vector<std::string> common = cases.front().tactics;
  for (const TuneCase& c : cases)
    std::erase_if(common, [&](const std::string& t) { return std::find(c.tactics.begin(), c.tactics.end(), t) == c.tactics.end(); });
  if (common.size() <= 1) return {};
  std::vector<TuneCase> out;
  for (const TuneCase& c : cases) out.push_back({c.tokens, common, {}});
  return out;
}

std::size_t TunePlan::measurements() const {
  std::size_t n = 0;
  for (const TuneCase& c : timed()) {
    std::vector<std::size_t> sizes;
    for (const auto& [tactic, variants] : c.variants) sizes.push_back(variants.size());
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    sizes.resize(std::min(sizes.size(), kVariantLeaders));
    n += c.tactics.size();
    for (std::size_t s : sizes) n += s;
  }
  return n;
}

std::vector<io::TuningEntry> tune(const TunePlan& plan, TacticTimer& timer, const TuneProgress& progress) {
  const std::vector<TuneCase> cases = plan.timed();
  const std::size_t total = plan.measurements();
  std::size_t done = 0;
  // `fresh`: the tactics of the batch not timed before (the plan's count).
  auto time = [&](std::int64_t tokens, const std::vector<std::string>& tactics, std::size_t fresh) {
    if (progress) progress(done, total, tokens, std::to_string(tactics.size()) + " tactics side by side");
    const std::vector<double> us = timer.time_us(tokens, tactics);
    require(us.size() == tactics.size(), "tune: the timer returned " + std::to_string(us.size()) + " times for " +
                                             std::to_string(tactics.size()) + " tactics");
    done += fresh;
    return us;
  };
  std::vector<std::vector<io::TunedTime>> times;
  for (const TuneCase& c : cases) {
    std::vector<io::TunedTime>& timed = times.emplace_back();
    if (c.tactics.empty()) continue;
    const std::vector<double> us = time(c.tokens, c.tactics, c.tactics.size());
    for (std::size_t i = 0; i < us.size(); ++i) timed.push_back({c.tactics[i], us[i]});
    // The leaders' variants, those not timed already, beside the leaders again. The leaders: the
    // fastest candidates that bring a variant not timed yet, so that candidates without one (or whose
    // variants a faster leader brought) do not crowd out a slower candidate's variant.
    std::vector<io::TunedTime> fastest = timed;
    std::stable_sort(fastest.begin(), fastest.end(), [](const io::TunedTime& a, const io::TunedTime& b) { return a.us < b.us; });
    std::vector<io::TunedTime> leaders;
    std::vector<std::string> variants;
    for (const io::TunedTime& l : fastest) {
      if (leaders.size() == kVariantLeaders) break;
      const auto v = c.variants.find(l.tactic);
      if (v == c.variants.end()) continue;
      std::size_t fresh = 0;
      for (const std::string& tactic : v->second)
        if (std::find(variants.begin(), variants.end(), tactic) == variants.end() &&
            std::none_of(timed.begin(), timed.end(), [&](const io::TunedTime& t) { return t.tactic == tactic; })) {
          variants.push_back(tactic);
          ++fresh;
        }
      if (fresh > 0) leaders.push_back(l);
    }
    if (variants.empty()) continue;
    std::vector<std::string> batch;
    for (const io::TunedTime& l : leaders) batch.push_back(l.tactic);
    const std::size_t first_variant = batch.size();
    batch.insert(batch.end(), variants.begin(), variants.end());
    const std::vector<double> again = time(c.tokens, batch, batch.size() - first_variant);
    double log_drift = 0;
    for (std::size_t i = 0; i < first_variant; ++i) log_drift += std::log(leaders[i].us / again[i]);
    const double drift = std::exp(log_drift / double(first_variant));
    for (std::size_t i = first_variant; i < batch.size(); ++i) timed.push_back({batch[i], again[i] * drift});
  }
  std::vector<io::TuningEntry> entries;
  if (plan.problem.batch_invariant) {
    if (cases.empty()) return entries;
    std::vector<io::TunedTime> mean;
    for (std::size_t t = 0; t < cases.front().tactics.size(); ++t) {
      double log_sum = 0;
      for (const auto& per_case : times) log_sum += std::log(per_case[t].us);
      mean.push_back({cases.front().tactics[t], rounded(std::exp(log_sum / double(times.size())))});
    }
    entries.push_back(entry_of(plan, 0, mean));
    return entries;
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    for (io::TunedTime& t : times[i]) t.us = rounded(t.us);
    entries.push_back(entry_of(plan, cases[i].tokens, times[i]));
  }
  return entries;
}

}  // namespace moekit::core
