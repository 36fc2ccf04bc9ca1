// Which tuning cache a layer reads and which entries apply (core/tuning.h), and the tuning loop
// with a fake timer (core/tune.h): CPU only.
#include "core/tuning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/tune.h"
#include "io/temp_dir.h"
#include "scoped_env.h"

namespace moekit::core {
namespace {

const io::TuningDevice kHere{"NVIDIA H200", 132, "13.0", "0.1.0"};

io::TuningProblem problem() {
  io::TuningProblem p;
  p.experts = 128;
  p.hidden = 2048;
  p.intermediate = 768;
  p.top_k = 8;
  p.quant = QuantScheme::fp8_block;
  return p;
}

io::TuningEntry entry(std::int64_t tokens, const std::string& tactic) {
  io::TuningEntry e;
  e.device = kHere;
  e.problem = problem();
  e.tokens = tokens;
  e.winner = {tactic, 10};
  return e;
}

std::string json_of(const std::vector<io::TuningEntry>& entries) {
  io::TuningCache c;
  c.entries = entries;
  return io::write_tuning_cache(c);
}

TuningSource given(const std::vector<io::TuningEntry>& entries) {
  TuningOptions o;
  o.json = json_of(entries);
  return load_tuning(o);
}

bool has_line(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

TEST(CoreTuning, AnEntryAppliesOnlyOnAnExactKeyAndEachMismatchIsNamed) {
  io::TuningEntry gpu = entry(1, "a"), sms = entry(2, "a"), cuda = entry(4, "a"), version = entry(8, "a"),
                  shape = entry(16, "a"), quant = entry(32, "a"), good = entry(64, "a");
  gpu.device.gpu = "NVIDIA H100 80GB HBM3";
  sms.device.sms = 114;
  cuda.device.cuda = "12.8";
  version.device.moekit = "0.0.9";
  shape.problem.experts = 256;
  quant.problem.accumulation = Fp8Accumulation::exact;
  const TunedTable t(given({gpu, sms, cuda, version, shape, quant, good}), kHere, problem(), "experts");
  ASSERT_EQ(t.entries().size(), 1u);
  EXPECT_NE(t.find(64), nullptr);
  EXPECT_NE(t.find(33), nullptr);  // T in (32, 64]: bucket 64
  EXPECT_EQ(t.find(65), nullptr);
  EXPECT_EQ(t.find(1), nullptr);
  const std::vector<std::string> report = t.report();
  EXPECT_TRUE(has_line(report, "7 entries, 1 apply to this layer")) << report[0];
  EXPECT_TRUE(has_line(report, "ignored 1 entry: GPU 'NVIDIA H100 80GB HBM3' != 'NVIDIA H200'"));
  EXPECT_TRUE(has_line(report, "ignored 1 entry: SMs 114 != 132"));
  EXPECT_TRUE(has_line(report, "ignored 1 entry: CUDA 12.8 != 13.0"));
  EXPECT_TRUE(has_line(report, "ignored 1 entry: moekit 0.0.9 != 0.1.0"));
  EXPECT_TRUE(has_line(report, "ignored 1 entry: problem: E 256 != 128"));
  EXPECT_TRUE(has_line(report, "ignored 1 entry: problem: fp8 accumulation exact != fast"));
}

TEST(CoreTuning, SameReasonsAreCountedAndRejectedEntriesKeepTheirReason) {
  io::TuningEntry a = entry(1, "a"), b = entry(2, "a");
  a.device.gpu = b.device.gpu = "other";
  TunedTable t(given({a, b, entry(4, "x")}), kHere, problem(), "experts");
  EXPECT_TRUE(has_line(t.report(), "ignored 2 entries: GPU 'other' != 'NVIDIA H200'"));
  t.reject(4, "tactic 'x' is not one of this build's");
  EXPECT_EQ(t.find(4), nullptr);
  EXPECT_TRUE(has_line(t.report(), "ignored 1 entry: tactic 'x' is not one of this build's"));
}

TEST(CoreTuning, BatchInvariantProblemsTakeTheEntryForEveryT) {
  io::TuningProblem p = problem();
  p.batch_invariant = true;
  io::TuningEntry e = entry(0, "a");
  e.problem = p;
  const TunedTable t(given({e, entry(64, "b")}), kHere, p, "experts");
  EXPECT_NE(t.find(1), nullptr);
  EXPECT_NE(t.find(100000), nullptr);
  EXPECT_EQ(t.find(1)->winner.tactic, "a");
  EXPECT_TRUE(has_line(t.report(), "problem: batch_invariant false != true"));
}

TEST(CoreTuning, LoadingFollowsOptionsThenTheEnvironmentThenTheDefaultPath) {
  test::TempDir dir;
  const std::string file = dir.file("t.json"), corrupt = dir.file("bad.json");
  std::ofstream(file) << json_of({entry(1, "a")});
  std::ofstream(corrupt) << "{\"format\": \"moekit-tuning\", \"version\": 1, \"entries\": [{]}";
  const test::ScopedEnv xdg("XDG_CACHE_HOME", dir.file("xdg").c_str());
  {
    const test::ScopedEnv env("MOEKIT_TUNING_CACHE", nullptr);
    EXPECT_EQ(default_tuning_cache_path(), dir.file("xdg") + "/moekit/tuning.json");
    const TuningSource none = load_tuning({});
    EXPECT_EQ(none.cache, nullptr);
    EXPECT_NE(none.problem.find("the default path " + dir.file("xdg") + "/moekit/tuning.json does not exist"),
              std::string::npos)
        << none.problem;
    std::filesystem::create_directories(dir.file("xdg") + "/moekit");
    std::filesystem::copy_file(file, dir.file("xdg") + "/moekit/tuning.json");
    const TuningSource by_default = load_tuning({});
    ASSERT_NE(by_default.cache, nullptr) << by_default.problem;
    EXPECT_EQ(by_default.origin, "the default path");
  }
  {
    const test::ScopedEnv env("MOEKIT_TUNING_CACHE", file.c_str());
    const TuningSource s = load_tuning({});
    ASSERT_NE(s.cache, nullptr) << s.problem;
    EXPECT_EQ(s.file, file);
    EXPECT_EQ(s.origin, "MOEKIT_TUNING_CACHE");
    EXPECT_EQ(s.cache->entries.size(), 1u);
    const TuningSource off = load_tuning({"off", ""});
    EXPECT_EQ(off.cache, nullptr);
    EXPECT_EQ(off.problem, "off (LayerOptions::tuning)");
    const TuningSource bad = load_tuning({corrupt, ""});
    EXPECT_EQ(bad.cache, nullptr);
    EXPECT_NE(bad.problem.find("rejected: " + corrupt + ": invalid JSON"), std::string::npos) << bad.problem;
    const TuningSource missing = load_tuning({dir.file("missing.json"), ""});
    EXPECT_EQ(missing.cache, nullptr);
    EXPECT_NE(missing.problem.find("cannot open"), std::string::npos) << missing.problem;
    EXPECT_NE(TunedTable(bad, kHere, problem(), "experts").report()[0].find("none (rejected:"), std::string::npos);
  }
  {
    const test::ScopedEnv env("MOEKIT_TUNING_CACHE", "off");
    EXPECT_EQ(load_tuning({}).problem, "off (MOEKIT_TUNING_CACHE)");
  }
}

// Times from a table; counts the calls.
class FakeTimer final : public TacticTimer {
 public:
  std::map<std::pair<std::int64_t, std::string>, double> us;
  int calls = 0;
  double time_us(std::int64_t tokens, const std::string& tactic) override {
    ++calls;
    return us.at({tokens, tactic});
  }
};

TunePlan plan(bool batch_invariant) {
  TunePlan p;
  p.device = kHere;
  p.problem = problem();
  p.problem.batch_invariant = batch_invariant;
  p.cases = {{1, {"h", "a", "b"}}, {2, {"h"}}, {4, {"h", "a"}}};
  p.measured = "fake";
  return p;
}

TEST(CoreTune, TheFastestWinsAndTheOthersFollowFastestFirst) {
  FakeTimer timer;
  // T=4: "a" is 1.9% faster, within kTunedGain: the heuristic stays (its runner-up first).
  timer.us = {{{1, "h"}, 30}, {{1, "a"}, 10.004}, {{1, "b"}, 20}, {{4, "h"}, 5.095}, {{4, "a"}, 5}};
  const TunePlan p = plan(false);
  EXPECT_EQ(p.measurements(), 5u);  // T=2 has one tactic: not timed
  std::vector<std::string> seen;
  const auto entries = tune(p, timer, [&](std::size_t done, std::size_t total, std::int64_t t, const std::string& tactic) {
    EXPECT_EQ(total, 5u);
    EXPECT_EQ(done, seen.size());
    seen.push_back(std::to_string(t) + tactic);
  });
  EXPECT_EQ(timer.calls, 5);
  EXPECT_EQ(seen, (std::vector<std::string>{"1h", "1a", "1b", "4h", "4a"}));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].tokens, 1);
  EXPECT_EQ(entries[0].winner.tactic, "a");
  EXPECT_EQ(entries[0].winner.us, 10.0);  // to 0.01 us
  ASSERT_EQ(entries[0].runners_up.size(), 2u);
  EXPECT_EQ(entries[0].runners_up[0].tactic, "b");
  EXPECT_EQ(entries[0].runners_up[1].tactic, "h");
  EXPECT_EQ(entries[0].measured, "fake");
  EXPECT_EQ(entries[1].winner.tactic, "h");  // within 2% of the fastest keeps the heuristic
  EXPECT_EQ(entries[1].runners_up.at(0).tactic, "a");
  // What the loop writes, the cache reads back, and the same key finds.
  const TunedTable t(given(entries), kHere, problem(), "experts");
  EXPECT_EQ(t.find(1)->winner.tactic, "a");
  EXPECT_EQ(t.find(3)->winner.tactic, "h");
  EXPECT_EQ(t.find(2), nullptr);
}

TEST(CoreTune, BatchInvariantTimesTheCommonTacticsEverywhereAndKeepsOne) {
  FakeTimer timer;
  // a: 2x slower at T=1, 4x faster at T=2 and T=4; the geometric mean prefers it.
  timer.us = {{{1, "h"}, 10}, {{1, "a"}, 20}, {{2, "h"}, 40}, {{2, "a"}, 10}, {{4, "h"}, 80}, {{4, "a"}, 20}};
  TunePlan p = plan(true);
  p.cases[1].tactics = {"h", "a", "c"};
  EXPECT_EQ(p.measurements(), 6u);  // b and c are not common to every case
  const auto entries = tune(p, timer, nullptr);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].tokens, 0);
  EXPECT_EQ(entries[0].winner.tactic, "a");
  EXPECT_NEAR(entries[0].winner.us, std::cbrt(20.0 * 10 * 20), 0.01);
  ASSERT_EQ(entries[0].runners_up.size(), 1u);
  EXPECT_EQ(entries[0].runners_up[0].tactic, "h");
  p.cases[1].tactics = {"h"};
  EXPECT_EQ(p.measurements(), 0u);  // one common tactic: nothing to choose
  EXPECT_TRUE(tune(p, timer, nullptr).empty());
}

}  // namespace
}  // namespace moekit::core
