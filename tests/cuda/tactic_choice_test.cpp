// Tactics of the GPU Experts step (cuda/layer/tactic.h): names, candidates, the chooser with a
// cache, and the staged path's launches at T (cuda/layer/experts.h). Host code only: it runs without a GPU (the device key is given, not asked).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/tune.h"
#include "cuda/layer/experts.h"
#include "cuda/layer/tactic.h"
#include "io/presets.h"

namespace moekit::test {
namespace {

const io::TuningDevice kHere{"NVIDIA H200", 132, "13.0", "0.1.0"};

MoEConfig preset(const std::string& name, QuantScheme quant, Fp8Accumulation accumulation, bool batch_invariant) {
  MoEConfig c = io::find_preset(name).config;
  c.quant.scheme = quant;
  c.quant.accumulation = accumulation;
  c.batch_invariant = batch_invariant;
  return c;
}

struct Case {
  std::string model;
  QuantScheme quant;
  Fp8Accumulation accumulation;
  bool batch_invariant;
  std::string name() const {
    std::string s = model + "_" + std::string(to_string(quant)) + "_" + std::string(to_string(accumulation)) +
                    (batch_invariant ? "_invariant" : "");
    for (char& c : s)
      if (c == '-') c = '_';
    return s;
  }
  MoEConfig config() const { return preset(model, quant, accumulation, batch_invariant); }
};

const std::vector<Case> kCases = {
    {"deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::fast, false},
    {"deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::exact, false},
    {"deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::strict, false},
    {"deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::fast, true},
    {"qwen3-30b-a3b", QuantScheme::fp8_block, Fp8Accumulation::fast, false},
    {"qwen3-30b-a3b", QuantScheme::bf16, Fp8Accumulation::fast, false},
    {"qwen3-30b-a3b", QuantScheme::fp8_block, Fp8Accumulation::exact, true},
    {"mixtral-8x7b", QuantScheme::fp8_tensor, Fp8Accumulation::fast, false},
    {"llama4-scout", QuantScheme::fp8_rowwise, Fp8Accumulation::exact, false},
    {"gpt-oss-120b", QuantScheme::bf16, Fp8Accumulation::fast, true},
};

class TacticChoice : public ::testing::TestWithParam<Case> {};

// Every candidate at every bucket: can run, has a name that parses back to it, and the heuristic's
// is the first. Batch-invariant: no candidate whose sums follow the batch.
TEST_P(TacticChoice, CandidatesRunAndNameThemselves) {
  const MoEConfig c = GetParam().config();
  for (std::int64_t t = 1; t <= 16384; t *= 2) {
    const cuda::TacticProblem p{c, t, 0, false};
    const std::vector<cuda::Tactic> candidates = cuda::candidate_tactics(p);
    ASSERT_FALSE(candidates.empty()) << "T=" << t;
    EXPECT_EQ(candidates.front(), cuda::heuristic_tactic(p).tactic) << "T=" << t;
    for (const cuda::Tactic& tactic : candidates) {
      EXPECT_TRUE(cuda::can_implement(tactic, p)) << tactic.name() << " T=" << t << ": "
                                                   << cuda::can_implement(tactic, p).reason();
      const auto back = cuda::parse_tactic(tactic.name());
      ASSERT_TRUE(back.has_value()) << tactic.name();
      EXPECT_EQ(*back, tactic);
      EXPECT_EQ(back->name(), tactic.name());
      if (c.batch_invariant) {
        EXPECT_EQ(tactic.path, cuda::TacticPath::staged) << tactic.name();
        for (cuda::GemmTile tile : {tactic.gemm1.tile, tactic.gemm2.tile}) {
          EXPECT_NE(tile, cuda::GemmTile::rows8_warp_mma) << tactic.name();
          EXPECT_NE(tile, cuda::GemmTile::m192_n128_wgmma) << tactic.name();
        }
      }
    }
  }
}

// A cache that names the heuristic's tactic gives the layer the same tactic, now tuned.
TEST_P(TacticChoice, TunedSelectionOfTheHeuristicsTacticIsTheHeuristics) {
  const MoEConfig c = GetParam().config();
  std::vector<io::TuningEntry> entries;
  for (std::int64_t t = 1; t <= 16384; t *= 2) {
    if (c.batch_invariant && t > 1) break;
    io::TuningEntry e;
    e.device = kHere;
    e.problem = io::TuningProblem::of(c);
    e.tokens = c.batch_invariant ? 0 : t;
    e.winner = {cuda::heuristic_tactic({c, t, 0, false}).tactic.name(), 1};
    entries.push_back(e);
  }
  io::TuningCache cache{entries};
  TuningOptions options{"", io::write_tuning_cache(cache)};
  const cuda::TacticChooser tuned(c, core::load_tuning(options, kHere), kHere);
  const cuda::TacticChooser heuristic(c, nullptr);
  for (std::int64_t t = 1; t <= 16384; t *= 2) {
    const cuda::TacticProblem p{c, t, 0, false};
    const cuda::TacticChoice a = tuned.choose(p), b = heuristic.choose(p);
    if (c.batch_invariant) {
      EXPECT_EQ(a.tactic, b.tactic) << "T=" << t;  // the heuristic keeps one tactic for every T too
      ASSERT_NE(a.tuned, nullptr);
      continue;
    }
    EXPECT_EQ(a.tactic, b.tactic) << "T=" << t;
    EXPECT_NE(a.tuned, nullptr) << "T=" << t << ": " << a.reason;
    EXPECT_EQ(b.tuned, nullptr);
    EXPECT_NE(cuda::describe(a, tuned.table().file()).find("tuned (the given JSON, 1.0 us)"), std::string::npos);
    EXPECT_EQ(cuda::describe(b, "").rfind("heuristic (", 0), 0u);
  }
}

// The tuning budget (<= 5 minutes for both presets on the H200): the measurements of
// deepseek-v3 and qwen3-30b-a3b at their defaults over T = 1 ... 16384 (754 took 30 s there; the
// persistent block-scaled tiles, candidates from 16 rows per group, make it 1022, the swapped tiles
// 1176: deepseek-v3's six buckets from T=512, 260 of them, took 34.3 s on 2026-12-04; the decode
// kernel's activated GEMM1 tiles 1570, all at T <= 2048 where a measurement takes microseconds),
// and the variants of the kVariantLeaders candidates with the most per bucket (the cluster and
// combine tiles: the second round, 1626 in all with one leader; the 160-column persistent tiles
// among the candidates and the TMA-store twins of the 128- and 192-column ones as variants, 2244 with
// the decode tile of 64 W rows (removed since): 375 more, all at the prefill buckets (deepseek-v3's
// six from T=512 took 34.3 s for 260); a decode bucket's measurement takes ~10-20 ms).
TEST(TacticBudget, BothPresetsTakeFewMeasurements) {
  std::size_t n = 0;
  for (const char* name : {"deepseek-v3", "qwen3-30b-a3b"}) {
    const MoEConfig c = io::find_preset(name).config;
    for (std::int64_t t = 1; t <= 16384; t *= 2) {
      const cuda::TacticProblem p{c, t, 0, false};
      const std::vector<cuda::Tactic> candidates = cuda::candidate_tactics(p);
      std::vector<std::size_t> sizes;
      for (const cuda::Tactic& tactic : candidates) {
        const std::vector<cuda::Tactic> v = cuda::tactic_variants(tactic, p);
        sizes.push_back(v.size());
        for (const cuda::Tactic& x : v) {
          EXPECT_TRUE(cuda::can_implement(x, p)) << x.name();
          EXPECT_EQ(std::find(candidates.begin(), candidates.end(), x), candidates.end()) << x.name() << ": a candidate too";
        }
      }
      std::sort(sizes.begin(), sizes.end(), std::greater<>());
      sizes.resize(std::min(sizes.size(), core::kVariantLeaders));
      if (candidates.size() > 1) n += candidates.size() + std::accumulate(sizes.begin(), sizes.end(), std::size_t(0));
    }
  }
  RecordProperty("measurements", int(n));
  EXPECT_LE(n, 2300u);
  EXPECT_GE(n, 60u);
}

// At decode sizes the staged path quantizes the input in the one-block plan's launch and its decode
// GEMM1 reads the rows by index (no gather); past the one-block plan (T k > 4096), in the EP pipeline
// and for the per-row schemes, Prepare and the gather run; an activated GEMM1 tile has no activation
// stage after it.
TEST(TacticSteps, DecodeSizesPrepareInThePlanAndReadRowsByIndex) {
  const MoEConfig c = io::find_preset("deepseek-v3").config;
  EXPECT_TRUE(cuda::plan_prepares_input(c, 1, false));
  EXPECT_TRUE(cuda::plan_prepares_input(c, 512, false));    // 4096 slots: the one-block plan's most
  EXPECT_FALSE(cuda::plan_prepares_input(c, 513, false));
  EXPECT_FALSE(cuda::plan_prepares_input(c, 1, true));      // expert parallelism prepares its own rows
  EXPECT_FALSE(cuda::plan_prepares_input(c, 0, false));
  MoEConfig rowwise = c;
  rowwise.quant.scheme = QuantScheme::fp8_rowwise;
  EXPECT_FALSE(cuda::plan_prepares_input(rowwise, 1, false));

  const cuda::Tactic decode{cuda::TacticPath::staged, {cuda::GemmTile::tokens8_n256_act}, {cuda::GemmTile::tokens8_n128_wgmma}};
  EXPECT_EQ(cuda::staged_steps(c, 1, decode),
            "permutation plan + the input's quantization (one launch), GEMM1 tokens8_n256_act (rows read by index) + "
            "activation + requantization, GEMM2 tokens8_n128_wgmma, finalize");
  const cuda::Tactic bf16_out{cuda::TacticPath::staged, {cuda::GemmTile::tokens8_n128_wgmma}, {cuda::GemmTile::tokens8_n128_wgmma}};
  EXPECT_EQ(cuda::staged_steps(c, 8, bf16_out),
            "permutation plan + the input's quantization (one launch), GEMM1 tokens8_n128_wgmma (rows read by index), "
            "activation + requantization, GEMM2 tokens8_n128_wgmma, finalize");
  const cuda::Tactic prefill{cuda::TacticPath::staged, {cuda::GemmTile::m64_n128_pingpong}, {cuda::GemmTile::m64_n128_pingpong}};
  EXPECT_EQ(cuda::staged_steps(c, 256, prefill),
            "permutation plan + the input's quantization (one launch), gather, GEMM1 m64_n128_pingpong, activation + "
            "requantization, GEMM2 m64_n128_pingpong, finalize");
  EXPECT_EQ(cuda::staged_steps(c, 4096, prefill),
            "quantize, permutation plan, gather, GEMM1 m64_n128_pingpong, activation + requantization, GEMM2 "
            "m64_n128_pingpong, finalize");
}

// GEMM2 + the weighted combine (tokens{8,16}_n128_combine): a GEMM2 tile only, where the one-block
// plan zeroes its counts (decode sizes), not inside the EP pipeline; a candidate there; explain says
// that no finalize runs.
TEST(TacticCombine, OnlyGemm2AtDecodeSizesOutsideExpertParallelism) {
  const MoEConfig c = preset("deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::fast, false);
  const cuda::Tactic combined{cuda::TacticPath::staged, {cuda::GemmTile::tokens8_n256_act}, {cuda::GemmTile::tokens8_n128_combine}};
  EXPECT_TRUE(cuda::can_implement(combined, {c, 1, 0, false}));
  EXPECT_TRUE(cuda::plan_takes_one_block(c, 512));
  EXPECT_FALSE(cuda::plan_takes_one_block(c, 513));
  EXPECT_FALSE(cuda::plan_takes_one_block(c, 0));
  const Status ep = cuda::can_implement(combined, {c, 1, 0, true});
  EXPECT_FALSE(ep);
  EXPECT_NE(ep.reason().find("not inside the expert-parallel pipeline"), std::string::npos) << ep.reason();
  const cuda::Tactic wide{cuda::TacticPath::staged, {cuda::GemmTile::m64_n128_pingpong}, {cuda::GemmTile::tokens16_n128_combine}};
  const Status past = cuda::can_implement(wide, {c, 1024, 0, false});
  EXPECT_FALSE(past);
  EXPECT_NE(past.reason().find("needs the one-block permutation plan"), std::string::npos) << past.reason();
  const cuda::Tactic first{cuda::TacticPath::staged, {cuda::GemmTile::tokens8_n128_combine}, {cuda::GemmTile::tokens8_n128_wgmma}};
  const Status g1 = cuda::can_implement(first, {c, 1, 0, false});
  EXPECT_FALSE(g1);
  EXPECT_NE(g1.reason().find("combines GEMM2's rows, not GEMM1's"), std::string::npos) << g1.reason();
  EXPECT_EQ(cuda::parse_tactic(combined.name()), combined);

  // A variant of the candidates with the decode GEMM2 (the tuner's second round), not a candidate.
  const cuda::TacticProblem at1{c, 1, 0, false};
  bool variant = false;
  for (const cuda::Tactic& t : cuda::candidate_tactics(at1)) {
    EXPECT_NE(cuda::output_of(t.gemm2.tile), cuda::GemmOutput::combined) << t.name();
    for (const cuda::Tactic& v : cuda::tactic_variants(t, at1)) {
      EXPECT_NE(cuda::output_of(v.gemm1.tile), cuda::GemmOutput::combined) << v.name();
      variant = variant || (cuda::output_of(v.gemm2.tile) == cuda::GemmOutput::combined && v.gemm1.tile == t.gemm1.tile);
    }
  }
  EXPECT_TRUE(variant);
  const cuda::TacticProblem in_ep{c, 1, 0, true};
  for (const cuda::Tactic& t : cuda::candidate_tactics(in_ep))
    for (const cuda::Tactic& v : cuda::tactic_variants(t, in_ep)) EXPECT_NE(cuda::output_of(v.gemm2.tile), cuda::GemmOutput::combined) << v.name();
  const cuda::Tactic decode{cuda::TacticPath::staged, {cuda::GemmTile::tokens8_n256_act}, {cuda::GemmTile::tokens8_n128_wgmma}};
  EXPECT_EQ(cuda::tactic_variants(decode, at1), (std::vector<cuda::Tactic>{combined}));
  EXPECT_EQ(cuda::staged_steps(c, 1, combined),
            "permutation plan + the input's quantization (one launch), GEMM1 tokens8_n256_act (rows read by index) + "
            "activation + requantization, GEMM2 tokens8_n128_combine + the weighted combine (no finalize)");
}

INSTANTIATE_TEST_SUITE_P(Presets, TacticChoice, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

io::TuningEntry entry_for(const MoEConfig& c, std::int64_t tokens, const std::string& tactic) {
  io::TuningEntry e;
  e.device = kHere;
  e.problem = io::TuningProblem::of(c);
  e.tokens = tokens;
  e.winner = {tactic, 12.5};
  e.runners_up = {{"min-latency", 13.25}};
  return e;
}

cuda::TacticChooser chooser(const MoEConfig& c, const std::vector<io::TuningEntry>& entries) {
  io::TuningCache cache{entries};
  return cuda::TacticChooser(c, core::load_tuning({"tuning.json", io::write_tuning_cache(cache)}, kHere), kHere);
}

TEST(TacticChooser, TakesATunedTacticThatDiffersFromTheHeuristics) {
  const MoEConfig c = preset("deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::fast, false);
  const std::string name = "staged gemm1=m64_n128_pingpong gemm2=m128_n128_cooperative";
  const cuda::TacticChooser ch = chooser(c, {entry_for(c, 1024, name)});
  const cuda::TacticChoice at = ch.choose({c, 1000, 0, false});
  EXPECT_EQ(at.tactic.name(), name);
  EXPECT_EQ(cuda::describe(at, ch.table().file()), "tuned (tuning.json, 12.5 us; runner-up min-latency 13.2 us)");
  EXPECT_EQ(ch.choose({c, 1025, 0, false}).tuned, nullptr);  // bucket 2048: none
  EXPECT_EQ(ch.choose({c, 0, 0, false}).tuned, nullptr);
}

TEST(TacticChooser, ATunedTacticThatCannotRunFallsBackWithTheReason) {
  const MoEConfig c = preset("deepseek-v3", QuantScheme::bf16, Fp8Accumulation::fast, false);
  // min-latency holds T k <= 512: T=128 cannot take it.
  const cuda::TacticChooser ch = chooser(c, {entry_for(c, 128, "min-latency")});
  const cuda::TacticChoice at = ch.choose({c, 128, 0, false});
  EXPECT_EQ(at.tuned, nullptr);
  EXPECT_EQ(at.tactic, cuda::heuristic_tactic({c, 128, 0, false}).tactic);
  EXPECT_NE(at.reason.find("the tuned min-latency cannot run at T=128: min-latency path: takes T·k <= 512"), std::string::npos)
      << at.reason;
  // Inside the EP pipeline: staged only, whatever the cache says.
  const cuda::TacticChooser small = chooser(c, {entry_for(c, 1, "min-latency")});
  EXPECT_EQ(small.choose({c, 1, 0, false}).tactic.path, cuda::TacticPath::min_latency);
  EXPECT_EQ(small.choose({c, 1, 0, true}).tactic.path, cuda::TacticPath::staged);
  // A forced path wins over the cache.
  MoEConfig staged = c;
  staged.experts_path = ExpertsPath::staged;
  const cuda::TacticChooser forced = chooser(staged, {entry_for(staged, 1, "min-latency")});
  EXPECT_EQ(forced.choose({staged, 1, 0, false}).tactic.path, cuda::TacticPath::staged);
  // fp8-block layers do not take min-latency (their decode GEMMs are the staged path's), a cache's
  // entry for them neither.
  const MoEConfig fp8 = preset("deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::fast, false);
  const cuda::TacticChoice refused = chooser(fp8, {entry_for(fp8, 1, "min-latency")}).choose({fp8, 1, 0, false});
  EXPECT_EQ(refused.tuned, nullptr);
  EXPECT_EQ(refused.tactic.path, cuda::TacticPath::staged);
  EXPECT_NE(refused.reason.find("min-latency path: takes bf16 layers, given fp8-block"), std::string::npos) << refused.reason;
}

TEST(TacticChooser, TacticsOfTheWrongSumsOrUnknownNamesAreRefused) {
  const MoEConfig c = preset("deepseek-v3", QuantScheme::fp8_block, Fp8Accumulation::strict, false);
  // strict needs f32-like sums: CUTLASS's tensor-core tiles do not give them.
  const std::string cutlass = "staged gemm1=m128_n128_cooperative gemm2=m128_n128_cooperative";
  const cuda::Tactic t = *cuda::parse_tactic(cutlass);
  const Status s = cuda::can_implement(t, {c, 4096, 0, false});
  EXPECT_FALSE(s);
  EXPECT_NE(s.reason().find("GEMM1 m128_n128_cooperative: does not sum as strict accumulation needs"), std::string::npos)
      << s.reason();
  const cuda::TacticChooser ch = chooser(c, {entry_for(c, 4096, cutlass), entry_for(c, 8, "staged gemm1=tiny gemm2=tiny")});
  EXPECT_EQ(ch.choose({c, 4096, 0, false}).tuned, nullptr);
  EXPECT_EQ(ch.choose({c, 8, 0, false}).tuned, nullptr);
  bool named = false;
  for (const std::string& line : ch.table().report())
    named = named || line.find("ignored 1 entry: tactic 'staged gemm1=tiny gemm2=tiny' is not one of this build's") !=
                         std::string::npos;
  EXPECT_TRUE(named);
  for (const char* bad : {"", "staged", "staged gemm1=m64_n128_pingpong", "min-latency ", "staged gemm1= gemm2=",
                          "STAGED gemm1=m64_n128_pingpong gemm2=m64_n128_pingpong"})
    EXPECT_FALSE(cuda::parse_tactic(bad).has_value()) << bad;
}

TEST(TacticChooser, WithoutACacheItIsTheHeuristicAndSaysWhy) {
  const MoEConfig c = preset("qwen3-30b-a3b", QuantScheme::bf16, Fp8Accumulation::fast, false);
  const cuda::TacticChooser ch(c, nullptr);
  EXPECT_EQ(ch.table().report().front(), "tuning cache: none (not read)");
  const cuda::TacticChoice at = ch.choose({c, 1, 0, false});
  EXPECT_EQ(at.tactic.path, cuda::TacticPath::min_latency);
  EXPECT_EQ(cuda::describe(at, ""), "heuristic (" + at.reason + ")");
  EXPECT_NE(at.reason.find("rows per expert <="), std::string::npos) << at.reason;
  // fp8-block at T=1: the staged path's decode GEMMs, and why.
  const MoEConfig fp8 = preset("qwen3-30b-a3b", QuantScheme::fp8_block, Fp8Accumulation::fast, false);
  const cuda::TacticChoice staged = cuda::TacticChooser(fp8, nullptr).choose({fp8, 1, 0, false});
  EXPECT_EQ(staged.tactic.path, cuda::TacticPath::staged);
  EXPECT_NE(staged.reason.find("given fp8-block"), std::string::npos) << staged.reason;
}

}  // namespace
}  // namespace moekit::test
