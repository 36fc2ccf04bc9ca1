// Tactics of the GPU Experts step (docs/TUNE.md): one complete, named kernel configuration (the
// path, and on the staged path the tile of each grouped GEMM), the candidates a problem allows,
// the heuristic's choice, and the chooser that prefers a tuned entry of the cache.
//   "min-latency"                                            min_latency.h's three kernels
//   "staged gemm1=m128_n128_cooperative gemm2=m64_n128_pingpong"  permute, GEMM1, activation, GEMM2
// A tactic names only kernels that sum as the layer's FP8 accumulation requires (grouped_gemm.h
// GemmSums), and for a batch-invariant layer only tiles whose sums do not depend on the batch.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/tuning.h"
#include "cuda/gemm/grouped_gemm.h"
#include "moekit/config.h"

namespace moekit::cuda {

enum class TacticPath : std::uint8_t { staged, min_latency };

struct Tactic {
  TacticPath path = TacticPath::staged;
  GroupedGemmConfig gemm1, gemm2;  // the staged path's
  std::string name() const;        // the cache's spelling (above)
  std::string to_string() const;   // the name, and the kernels in words (explain)
  bool operator==(const Tactic& o) const {
    return path == o.path && (path == TacticPath::min_latency || (gemm1.tile == o.gemm1.tile && gemm2.tile == o.gemm2.tile));
  }
};
std::optional<Tactic> parse_tactic(std::string_view name);
// The tile's name in a tactic ("m64_n128_pingpong").
std::string_view tile_id(GemmTile tile);

// One call of the step: the layer's config and T.
struct TacticProblem {
  MoEConfig config;
  std::int64_t tokens = 0;
  std::int64_t max_rows = 0;     // rows of the staged path's expert order, padding included (0: not known)
  bool expert_parallel = false;  // inside the EP pipeline, which combines itself: staged only
};

// The staged path's two GEMMs at T, and how each must sum.
struct StagedGemms {
  GroupedGemmDesc gemm1, gemm2;
  GemmSums sums1 = GemmSums::tensor_core, sums2 = GemmSums::tensor_core;
  double rows_per_group = 0;  // T k / E
};
StagedGemms staged_gemms(const TacticProblem& p);

Status can_implement(const Tactic& tactic, const TacticProblem& p);

struct TacticChoice {
  Tactic tactic;
  const io::TuningEntry* tuned = nullptr;  // the cache entry it came from; null: the heuristic
  std::string reason;  // heuristic: its rules (and why a tuned entry was not used); tuned: empty
};
// The heuristic: min_latency::choose, then choose_gemm_config for each GEMM.
TacticChoice heuristic_tactic(const TacticProblem& p);
// Every tactic the tuner times at T: implementable, summing as the config needs, the heuristic's
// first. Tiles that cannot win are left out (the decode GEMMs past 8 to 64 rows per group, the
// persistent 128-row tiles below 16).
std::vector<Tactic> candidate_tactics(const TacticProblem& p);
// A candidate's variants, the tuner's second round at T (it times those of the three fastest that
// have new ones): the tactic with its persistent tiles on 2-block clusters (*_x2) or writing by TMA
// stores (*_tma), its decode GEMM2 with the weighted combine (tokens*_n128_combine), or both GEMMs'
// twins; those that can run. None for min-latency.
std::vector<Tactic> tactic_variants(const Tactic& t, const TacticProblem& p);

// The key of this process's GPU (device 0), CUDA runtime and moekit version.
io::TuningDevice this_device();

// What the stage runs at each T: the tuned entry of T's bucket when the cache has one for this
// GPU and config and its tactic can run, else the heuristic. Thread-safe (forward may run from
// several threads); a tuned tactic that cannot run is a fallback logged once per bucket (warn).
class TacticChooser {
 public:
  // Reads options' cache (null: none, the heuristic alone) against this_device().
  TacticChooser(const MoEConfig& config, const TuningOptions* options);
  TacticChooser(const MoEConfig& config, const core::TuningSource& source, const io::TuningDevice& here);
  TacticChoice choose(const TacticProblem& p) const;
  const core::TunedTable& table() const { return table_; }

 private:
  core::TunedTable table_;
  std::map<std::int64_t, Tactic> tactics_;  // the parsed winner of each bucket of table_
  mutable std::mutex mutex_;
  mutable std::set<std::int64_t> warned_;
};

// "tuned (FILE, 12.3 us; runner-up NAME 13.1 us)" or "heuristic (REASON)", for explain.
std::string describe(const TacticChoice& choice, const std::string& file);

}  // namespace moekit::cuda
