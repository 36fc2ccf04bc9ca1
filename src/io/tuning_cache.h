// The tuning cache (docs/TUNE.md): measured tactics per GPU, problem and token bucket, as JSON.
// Written by `moekit tune`, read by every Layer. Parsed defensively (it may be stale, corrupted
// or hostile): any flaw rejects the whole file with the source and the reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"

namespace moekit::io {

// Who measured: an entry applies only on the same GPU model, SM count, CUDA runtime and moekit.
struct TuningDevice {
  std::string gpu;     // e.g. "NVIDIA H200"
  int sms = 0;         // multiprocessors
  std::string cuda;    // runtime version, e.g. "13.0"
  std::string moekit;  // moekit::version()
  std::string to_string() const;
};

// What was measured: every part of a layer's config its kernels' choice depends on.
struct TuningProblem {
  std::int64_t experts = 0;  // E (global)
  std::int64_t hidden = 0;   // H: GEMM1's K, GEMM2's N
  std::int64_t intermediate = 0;  // I
  std::int64_t top_k = 0;
  int ep_size = 1;
  Activation activation = Activation::silu_and_mul;
  QuantScheme quant = QuantScheme::bf16;
  ScaleFormat scale_format = ScaleFormat::f32;
  Fp8Accumulation accumulation = Fp8Accumulation::fast;
  bool batch_invariant = false;
  static TuningProblem of(const MoEConfig& config);
  std::string to_string() const;
  // The first field in which `other` differs from this, as "E 128 != 256" (this one's value last); empty when equal.
  std::string difference(const TuningProblem& other) const;
};

struct TunedTime {
  std::string tactic;  // the step's tactic name (src/cuda/layer/tactic.h)
  double us = 0;       // median layer time
};

struct TuningEntry {
  TuningDevice device;
  TuningProblem problem;
  std::string step = "experts";
  // The token bucket: T in (tokens/2, tokens], a power of two (T = 1: bucket 1). 0: every T (a
  // batch-invariant layer keeps one tactic).
  std::int64_t tokens = 0;
  TunedTime winner;
  std::vector<TunedTime> runners_up;  // fastest first
  std::string measured;               // how (preset, routing, runs, date): for people, not matched
};

struct TuningCache {
  std::vector<TuningEntry> entries;
};

inline constexpr std::size_t kTuningCacheMaxBytes = 16u << 20;
inline constexpr std::size_t kTuningCacheMaxEntries = 100000;
inline constexpr std::size_t kTuningMaxRunnersUp = 64;
inline constexpr std::int64_t kTuningMaxTokens = std::int64_t(1) << 30;

// The bucket of T: the smallest power of two >= T (0 for T = 0).
std::int64_t token_bucket(std::int64_t tokens);

// Throws moekit::Error naming `source` and the first flaw (grammar, field, range, duplicate).
TuningCache parse_tuning_cache(std::string_view text, const std::string& source);
TuningCache read_tuning_cache(const std::string& path);
// JSON that parse_tuning_cache reads back to the same cache (times to 0.01 µs).
std::string write_tuning_cache(const TuningCache& cache);
// Adds `entries`, each replacing one of the same device, problem, step and bucket.
void merge_tuning_entries(TuningCache& cache, const std::vector<TuningEntry>& entries);

}  // namespace moekit::io
