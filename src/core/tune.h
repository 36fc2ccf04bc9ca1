// The tuning loop of `moekit tune` (docs/TUNE.md), apart from how a tactic is timed: the GPU's
// timer replays CUDA graphs with a cold L2 (tools/cmd_tune.cpp); tests give a fake one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/tuning_cache.h"

namespace moekit::core {

class TacticTimer {
 public:
  virtual ~TacticTimer() = default;
  // The median µs of the layer at T = tokens with the step running each of `tactics`, timed side by
  // side: the replays interleaved (each round replays every tactic once, the order rotated by one a
  // round), so that the clocks' drift over the measurement touches every tactic alike. A tactic timed
  // alone after another (its median of consecutive replays) moved by up to 12% against the layer's
  // additive model at deepseek-v3 T=4096 (docs/TUNE.md).
  virtual std::vector<double> time_us(std::int64_t tokens, const std::vector<std::string>& tactics) = 0;
};

struct TuneCase {
  std::int64_t tokens = 0;           // a bucket, timed at T = tokens
  std::vector<std::string> tactics;  // the candidates at T, the heuristic's first
  // Variants of a candidate (its tiles on clusters, its GEMM2 with the combine), timed after the
  // candidates for the kVariantLeaders fastest of them: variants[tactic], none where absent.
  std::map<std::string, std::vector<std::string>> variants;
};

struct TunePlan {
  io::TuningDevice device;
  io::TuningProblem problem;
  std::vector<TuneCase> cases;
  std::string measured;  // copied into each entry
  // The tactics each case times: every one where more than one can run; a batch-invariant
  // problem times the tactics that every case can run, at every case, or nothing when only one can
  // (and no variants).
  std::vector<TuneCase> timed() const;
  // At most this many: each timed case's candidates and the variants of its kVariantLeaders
  // candidates with the most.
  std::size_t measurements() const;
};

// The candidates whose variants are timed: the fastest three that bring a variant not timed yet. A
// variant of the fastest alone missed the tile that measured fastest by itself: at deepseek-v3 T=4096
// GEMM2's 128 x 192 tile on clusters (1420.7 against 1594.2 us for the best one-block tile,
// docs/perf-log/grouped-gemm.md G9) while the fastest candidate's GEMM2 was the 128 x 128 tile. The
// fastest three alone missed GEMM1's activated tile on clusters at deepseek-v3 T >= 8192, where the
// three were CUTLASS's GEMM1 (no variant) with different GEMM2s.
inline constexpr std::size_t kVariantLeaders = 3;

// `moekit tune --skew`: each tactic's time over several routings, the geometric mean of its medians
// (per_routing[r][t]: routing r's median of tactic t), so that every routing weighs alike whatever its
// scale; one routing's medians as they are. Throws Error when the routings' counts of tactics differ,
// or a median is not positive.
std::vector<double> geometric_means(const std::vector<std::vector<double>>& per_routing);

// Called before each side-by-side measurement: done of total tactics timed, the case and what is timed now.
using TuneProgress = std::function<void(std::size_t done, std::size_t total, std::int64_t tokens, const std::string& what)>;

// A tactic displaces the heuristic's only when it is faster by more than this share: on the
// H200 the timer's medians of one tactic move by up to ~2% from run to run, and the choices that
// won by less measured 0.986-1.042 of the heuristic in the warm-input bench (docs/TUNE.md).
inline constexpr double kTunedGain = 0.02;

// Times plan.timed(): per case its candidates side by side, then the kVariantLeaders fastest
// candidates that bring new variants again side by side with those variants, each variant's time
// scaled by the leaders' own drift between the two measurements (the geometric mean of first /
// again), so that they compare.
// Per case the fastest wins (the heuristic's tactic while it is within kTunedGain of the fastest)
// and the others are its runners-up, fastest first (ties: the earlier candidate, the heuristic
// first). Batch-invariant: one entry (tokens 0) whose times are the geometric means over the cases.
std::vector<io::TuningEntry> tune(const TunePlan& plan, TacticTimer& timer, const TuneProgress& progress);

}  // namespace moekit::core
