// Which tuning cache a layer reads and which entries apply (core/tuning.h), and the tuning loop
// with a fake timer (core/tune.h): CPU only.
#include "core/tuning.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/tune.h"
#include "moekit/moekit.h"
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
  return load_tuning(o, kHere);
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
    const TuningSource none = load_tuning({}, kHere);
    EXPECT_EQ(none.cache, nullptr);
    EXPECT_NE(none.problem.find("no per-user cache at " + dir.file("xdg") + "/moekit/tuning.json; none shipped for "
                                "'NVIDIA H200' with 132 SMs in "),
              std::string::npos)
        << none.problem;
    std::filesystem::create_directories(dir.file("xdg") + "/moekit");
    std::filesystem::copy_file(file, dir.file("xdg") + "/moekit/tuning.json");
    const TuningSource by_default = load_tuning({}, kHere);
    ASSERT_NE(by_default.cache, nullptr) << by_default.problem;
    EXPECT_EQ(by_default.origin, "the default path");
  }
  {
    const test::ScopedEnv env("MOEKIT_TUNING_CACHE", file.c_str());
    const TuningSource s = load_tuning({}, kHere);
    ASSERT_NE(s.cache, nullptr) << s.problem;
    EXPECT_EQ(s.file, file);
    EXPECT_EQ(s.origin, "MOEKIT_TUNING_CACHE");
    EXPECT_EQ(s.cache->entries.size(), 1u);
    const TuningSource off = load_tuning({"off", ""}, kHere);
    EXPECT_EQ(off.cache, nullptr);
    EXPECT_EQ(off.problem, "off (LayerOptions::tuning)");
    const TuningSource bad = load_tuning({corrupt, ""}, kHere);
    EXPECT_EQ(bad.cache, nullptr);
    EXPECT_NE(bad.problem.find("rejected: " + corrupt + ": invalid JSON"), std::string::npos) << bad.problem;
    const TuningSource missing = load_tuning({dir.file("missing.json"), ""}, kHere);
    EXPECT_EQ(missing.cache, nullptr);
    EXPECT_NE(missing.problem.find("cannot open"), std::string::npos) << missing.problem;
    EXPECT_NE(TunedTable(bad, kHere, problem(), "experts").report()[0].find("none (rejected:"), std::string::npos);
  }
  {
    const test::ScopedEnv env("MOEKIT_TUNING_CACHE", "off");
    EXPECT_EQ(load_tuning({}, kHere).problem, "off (MOEKIT_TUNING_CACHE)");
  }
  {  // a cache of another GPU loads, and its report says it applies nowhere here
    io::TuningEntry other = entry(1, "a");
    other.device.gpu = "NVIDIA H100 80GB HBM3";
    const TuningSource s = given({other});
    ASSERT_NE(s.cache, nullptr) << s.problem;
    EXPECT_EQ(s.origin, "LayerOptions::tuning; no entry of it was measured on 'NVIDIA H200' with 132 SMs, so the heuristic decides");
    EXPECT_NE(s.to_string().find("so the heuristic decides): 1 entries"), std::string::npos) << s.to_string();
    EXPECT_EQ(given({entry(1, "a")}).origin, "LayerOptions::tuning");
  }
}

// The caches shipped in data/tuning/, as an installed moekit holds them beside its binary.
const std::string kShipped = std::string(MOEKIT_TEST_DATA) + "/../../data/tuning";

// A layer reads the shipped cache of its GPU: found by GPU name and SM count (a fake GPU, or the
// same name with other SMs, has none: the heuristic decides), its entries then matched one by one.
TEST(CoreTuning, TheShippedCacheIsFoundByGpuNameAndSmCount) {
  const io::TuningDevice h200{"NVIDIA H200", 132, "13.0", std::string(version())};
  const TuningSource shipped = shipped_tuning(h200, {"/nonexistent", kShipped});
  ASSERT_NE(shipped.cache, nullptr) << shipped.problem;
  EXPECT_EQ(std::filesystem::path(shipped.file).filename(), "h200.json");
  EXPECT_EQ(shipped.origin, "shipped with moekit for NVIDIA H200 with 132 SMs");
  io::TuningProblem deepseek = problem();
  deepseek.experts = 256;
  deepseek.hidden = 7168;
  deepseek.intermediate = 2048;
  const TunedTable tuned(shipped, h200, deepseek, "experts");
  EXPECT_NE(tuned.find(256), nullptr) << tuned.report()[0];
  EXPECT_NE(tuned.report()[0].find("h200.json (shipped with moekit for NVIDIA H200 with 132 SMs)"), std::string::npos);

  // The H100 (SXM) has its own, taken before h200.json by name and passed over by the H200.
  const io::TuningDevice h100{"NVIDIA H100 80GB HBM3", 132, "13.0", std::string(version())};
  const TuningSource h100_shipped = shipped_tuning(h100, {kShipped});
  ASSERT_NE(h100_shipped.cache, nullptr) << h100_shipped.problem;
  EXPECT_EQ(std::filesystem::path(h100_shipped.file).filename(), "h100.json");
  const TunedTable h100_tuned(h100_shipped, h100, deepseek, "experts");
  for (const std::int64_t t : {1, 64, 256, 4096, 16384}) EXPECT_NE(h100_tuned.find(t), nullptr) << t;

  for (const io::TuningDevice& other : {io::TuningDevice{"NVIDIA Fake GPU", 132, "13.0", "0.1.0"},
                                        io::TuningDevice{"NVIDIA H200", 114, "13.0", "0.1.0"}}) {
    const TuningSource none = shipped_tuning(other, {kShipped});
    EXPECT_EQ(none.cache, nullptr) << other.to_string();
    EXPECT_EQ(none.problem, "none shipped for '" + other.gpu + "' with " + std::to_string(other.sms) + " SMs in " + kShipped);
    EXPECT_EQ(TunedTable(none, other, deepseek, "experts").find(256), nullptr);
  }
}

// The first file (by name) measured on the GPU is taken; a broken one is passed over.
TEST(CoreTuning, TheShippedCacheIsTheFirstFileOfTheGpuAndBrokenFilesAreSkipped) {
  test::TempDir dir;
  io::TuningEntry fake = entry(1, "a");
  fake.device.gpu = "NVIDIA Fake GPU";
  std::ofstream(dir.file("a.json")) << "{";
  std::ofstream(dir.file("b.json")) << json_of({fake});
  std::ofstream(dir.file("c.json")) << json_of({entry(1, "a")});
  std::ofstream(dir.file("d.json")) << json_of({entry(2, "a")});
  std::ofstream(dir.file("notes.txt")) << json_of({entry(1, "a")});
  const TuningSource s = shipped_tuning(kHere, {dir.file("")});
  ASSERT_NE(s.cache, nullptr) << s.problem;
  EXPECT_EQ(std::filesystem::path(s.file).filename(), "c.json");
  EXPECT_EQ(shipped_tuning(fake.device, {dir.file("")}).file, dir.file("b.json"));
}

// With no option, variable or per-user file, a layer takes the cache shipped beside its binary
// (here: the test program's folder); without a GPU, none.
TEST(CoreTuning, LoadingEndsWithTheCacheShippedBesideTheBinary) {
  test::TempDir dir;
  const test::ScopedEnv env("MOEKIT_TUNING_CACHE", nullptr);
  const test::ScopedEnv xdg("XDG_CACHE_HOME", dir.file("xdg").c_str());
  const std::vector<std::string> dirs = shipped_tuning_dirs();
  const std::filesystem::path exe = std::filesystem::canonical("/proc/self/exe");
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], (exe.parent_path() / "tuning").string());
  EXPECT_EQ(dirs[1], (exe.parent_path().parent_path() / "share" / "moekit" / "tuning").string());
  ASSERT_FALSE(std::filesystem::exists(dirs[0])) << "the test makes it";
  std::filesystem::create_directories(dirs[0]);
  struct Remove {
    std::string path;
    ~Remove() { std::filesystem::remove_all(path); }
  } remove{dirs[0]};
  std::ofstream(dirs[0] + "/gpu.json") << json_of({entry(1, "a")});
  const TuningSource s = load_tuning({}, kHere);
  ASSERT_NE(s.cache, nullptr) << s.problem;
  EXPECT_EQ(s.file, dirs[0] + "/gpu.json");
  EXPECT_EQ(s.origin, "shipped with moekit for NVIDIA H200 with 132 SMs; MOEKIT_TUNING_CACHE unset, no per-user cache at " +
                          dir.file("xdg") + "/moekit/tuning.json");
  EXPECT_EQ(load_tuning({"off", ""}, kHere).cache, nullptr);
  const TuningSource no_gpu = load_tuning({}, {"none", 0, "none", "0.1.0"});
  EXPECT_EQ(no_gpu.cache, nullptr);
  EXPECT_NE(no_gpu.problem.find("no GPU, so no shipped cache"), std::string::npos) << no_gpu.problem;
}

// Times from a table, each side-by-side measurement `drift` slower than the one before (the clocks of
// a GPU warming up); counts the measurements.
class FakeTimer final : public TacticTimer {
 public:
  std::map<std::pair<std::int64_t, std::string>, double> us;
  double drift = 0;
  int calls = 0;
  std::vector<double> time_us(std::int64_t tokens, const std::vector<std::string>& tactics) override {
    const double factor = 1 + drift * calls++;
    std::vector<double> out;
    for (const std::string& t : tactics) out.push_back(us.at({tokens, t}) * factor);
    return out;
  }
};

TunePlan plan(bool batch_invariant) {
  TunePlan p;
  p.device = kHere;
  p.problem = problem();
  p.problem.batch_invariant = batch_invariant;
  p.cases = {{1, {"h", "a", "b"}, {}}, {2, {"h"}, {}}, {4, {"h", "a"}, {}}};
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
  std::vector<std::size_t> done_before;
  const auto entries = tune(p, timer, [&](std::size_t done, std::size_t total, std::int64_t t, const std::string& what) {
    EXPECT_EQ(total, 5u);
    done_before.push_back(done);
    seen.push_back(std::to_string(t) + ": " + what);
  });
  EXPECT_EQ(timer.calls, 2);  // each case's candidates side by side
  EXPECT_EQ(seen, (std::vector<std::string>{"1: 3 tactics side by side", "4: 2 tactics side by side"}));
  EXPECT_EQ(done_before, (std::vector<std::size_t>{0, 3}));
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

// More candidates than a cache entry holds runners-up (the swapped tiles took deepseek-v3 T=512 past
// 64): the entry keeps the fastest, and the cache reads it back.
TEST(CoreTune, AnEntryKeepsAtMostTheRunnersUpACacheHolds) {
  FakeTimer timer;
  TunePlan p = plan(false);
  p.cases = {p.cases[0]};
  p.cases[0].tactics = {"h"};
  timer.us = {{{1, "h"}, 1000}};
  for (int i = 0; i < 80; ++i) {
    p.cases[0].tactics.push_back("t" + std::to_string(i));
    timer.us[{1, "t" + std::to_string(i)}] = 100.0 + i;
  }
  const auto entries = tune(p, timer, nullptr);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].winner.tactic, "t0");
  ASSERT_EQ(entries[0].runners_up.size(), io::kTuningMaxRunnersUp);
  EXPECT_EQ(entries[0].runners_up.front().tactic, "t1");
  EXPECT_EQ(entries[0].runners_up.back().tactic, "t64");
  const TunedTable t(given(entries), kHere, problem(), "experts");
  ASSERT_NE(t.find(1), nullptr) << t.report()[0];
  EXPECT_EQ(t.find(1)->winner.tactic, "t0");
}

// Variants (a candidate's tiles on clusters, its GEMM2 with the combine) are timed for the three
// fastest candidates that bring one not timed yet, after the candidates, side by side with those
// again, and may win; the plan counts the most they may add. A variant's time is scaled by the
// leaders' drift between the two measurements (here each measurement 10% slower than the one
// before): it does not count against it.
TEST(CoreTune, TheLeadersVariantsAreTimedBesideThemAndMayWin) {
  FakeTimer timer;
  timer.drift = 0.1;
  timer.us = {{{1, "h"}, 30}, {{1, "a"}, 10}, {{1, "b"}, 20}, {{1, "c"}, 40}, {{1, "a2"}, 8}, {{1, "a3"}, 12},
              {{1, "b2"}, 9}, {{1, "c2"}, 50}, {{4, "h"}, 5},  {{4, "a"}, 6},  {{4, "a2"}, 7}};
  TunePlan p = plan(false);
  p.cases[0].tactics.push_back("c");
  p.cases[0].tactics.push_back("d");
  timer.us[{1, "d"}] = 45;
  // a's b: timed already; b2 twice: timed once. h (third) brings nothing new, so c (fourth) leads too;
  // d (fifth) would, but three lead.
  p.cases[0].variants = {{"a", {"a2", "a3", "b"}}, {"b", {"b2"}}, {"h", {"b2"}}, {"c", {"c2"}}, {"d", {"d2"}}};
  p.cases[2].variants = {{"a", {"a2"}}};  // T=4: the second candidate's variant, beside it alone
  EXPECT_EQ(p.measurements(), 7u + (3u + 1u + 1u) + 1u);
  std::vector<std::string> seen;
  std::vector<std::size_t> done_before;
  const auto entries = tune(p, timer, [&](std::size_t done, std::size_t, std::int64_t t, const std::string& what) {
    done_before.push_back(done);
    seen.push_back(std::to_string(t) + ": " + what);
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"1: 5 tactics side by side", "1: 7 tactics side by side",
                                            "4: 2 tactics side by side", "4: 2 tactics side by side"}));
  EXPECT_EQ(done_before, (std::vector<std::size_t>{0, 5, 9, 11}));  // the leaders again: not counted twice
  EXPECT_EQ(timer.calls, 4);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].winner.tactic, "a2");
  EXPECT_EQ(entries[0].winner.us, 8.0);  // 8.8 beside the leaders 10% slower than they first measured
  ASSERT_EQ(entries[0].runners_up.size(), 8u);
  EXPECT_EQ(entries[0].runners_up[0].tactic, "b2");
  EXPECT_EQ(entries[0].runners_up[0].us, 9.0);
  EXPECT_EQ(entries[0].runners_up[1].tactic, "a");
  EXPECT_EQ(entries[0].runners_up[1].us, 10.0);
  EXPECT_EQ(entries[0].runners_up[2].tactic, "a3");
  EXPECT_EQ(entries[0].runners_up[2].us, 12.0);
  EXPECT_EQ(entries[0].runners_up.back().tactic, "c2");
  EXPECT_EQ(entries[0].runners_up.back().us, 50.0);
  for (const io::TunedTime& t : entries[0].runners_up) EXPECT_NE(t.tactic, "d2");
  // T=4 measured third (x 1.2), its variants fourth (x 1.3), scaled back to the third's drift.
  EXPECT_EQ(entries[1].winner.tactic, "h");
  EXPECT_EQ(entries[1].winner.us, 6.0);
  ASSERT_EQ(entries[1].runners_up.size(), 2u);
  EXPECT_EQ(entries[1].runners_up[0].tactic, "a");
  EXPECT_EQ(entries[1].runners_up[1].tactic, "a2");
  EXPECT_EQ(entries[1].runners_up[1].us, 8.4);
  p.problem.batch_invariant = true;  // the common tactics alone, no variants
  for (const TuneCase& c : p.timed()) EXPECT_TRUE(c.variants.empty());
}

// A timer that answers for fewer tactics than it was given is an error, not a shifted table.
TEST(CoreTune, ATimerMustTimeEveryTacticItIsGiven) {
  class Short final : public TacticTimer {
   public:
    std::vector<double> time_us(std::int64_t, const std::vector<std::string>& tactics) override {
      return std::vector<double>(tactics.size() - 1, 1.0);
    }
  } timer;
  try {
    tune(plan(false), timer, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("returned 2 times for 3 tactics"), std::string::npos) << e.what();
  }
}

// --skew: a tactic that ties on even routing but is slow on the skewed one ranks behind one that
// holds on both, whatever the routings' scales (the skewed layer here is 3x faster in all).
TEST(CoreTune, SkewedRoutingsWeighAlikeInTheGeometricMean) {
  const std::vector<double> means = geometric_means({{100.0, 101.0, 400.0}, {40.0, 30.0, 10.0}});
  ASSERT_EQ(means.size(), 3u);
  EXPECT_NEAR(means[0], std::sqrt(100.0 * 40.0), 1e-9);
  EXPECT_NEAR(means[1], std::sqrt(101.0 * 30.0), 1e-9);
  EXPECT_NEAR(means[2], 63.245553203367585, 1e-9);
  EXPECT_LT(means[1], means[0]);
  const std::vector<double> one = geometric_means({{12.5, 7.25}});
  EXPECT_EQ(one, (std::vector<double>{12.5, 7.25}));
  auto message = [](const std::vector<std::vector<double>>& m) {
    try {
      geometric_means(m);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{1.0, 2.0}, {1.0}}).find("1 times for a routing, expected 2"), std::string::npos);
  EXPECT_NE(message({{1.0, 0.0}}).find("a tactic's median is 0"), std::string::npos);
  EXPECT_NE(message({}).find("no routing timed"), std::string::npos);
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
