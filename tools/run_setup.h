// What `moekit run` (and `explain`) work on: the config, weights and inputs, from a preset
// and a seed or from a layer file.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "cli_args.h"
#include "core/master_weights.h"
#include "core/skew.h"
#include "core/synthetic.h"
#include "io/checkpoint.h"
#include "io/layer_file.h"
#include "moekit/moekit.h"

namespace moekit::cli {

enum class RoutingMode { fused, external };

// full: what `run` needs (weights and inputs read or generated); problem: what `explain` needs
// (the config and T, from the same flags and checks, reading headers and configs only).
enum class SetupDepth { full, problem };

struct RunSetup {
  MoEConfig config;
  std::string source;  // "preset deepseek-v3, seed 1", "file F" or "checkpoint DIR, layer N"
  core::RouterSkew skew;             // --skew: none unless given
  std::vector<float> skew_bias;      // [E], added to the generated router_logits; empty without a skew
  RoutingMode routing = RoutingMode::fused;
  std::int64_t tokens = 0;  // T
  Tensor hidden, router_logits, topk_ids, topk_weights;  // topk_* given for external routing
  Tensor expected_out;                                    // from a layer file, when it has one
  Weights weights;
  std::unique_ptr<core::MasterWeights> master;  // for the ideal reference
  // Owners of the weights.
  std::optional<core::SyntheticLayer> synthetic;
  std::optional<io::LayerFile> file;
  std::optional<io::CheckpointLayer> checkpoint;
};

// The flags that choose the problem (shared by run and explain).
std::vector<Flag> problem_flags();
// --fp8-accumulation exact|fast|strict (when given; else c keeps its own, by default fast) and
// --batch-invariant onto c (validated), and their flags.
void apply_run_options(MoEConfig& c, const Args& args);
Flag accumulation_flag();
Flag batch_invariance_flag();
Flag path_flag();
Flag shared_experts_flag();
Flag skew_flag();
// --skew SPEC (none when not given); a bad SPEC is a UsageError naming --skew.
core::RouterSkew skew_of(const Args& args);
// --skew SPEC[,SPEC...] (`moekit tune`): each parsed, [none] when not given; a bad SPEC is a
// UsageError naming --skew.
std::vector<core::RouterSkew> skews_of(const Args& args);
// The bias [E] of --skew for E experts and the problem's seed (core/skew.h); empty without it.
std::vector<float> skew_bias_of(const Args& args, std::int64_t experts, std::uint64_t seed);
// --shared-experts N (0 when not given).
std::int64_t shared_experts_of(const Args& args);

// The problem of the flags (--preset, --inputs or --checkpoint, with their options), checked.
// full: weights generated or read, inputs generated or read; with ep_size > 1 only this
// rank's experts are generated or read, the inputs are the whole batch. problem: the config
// and T only (--tokens optional there, default 64), nothing but headers and configs read.
RunSetup setup_from_args(const Args& args, int ep_size = 1, int ep_rank = 0, SetupDepth depth = SetupDepth::full);

}  // namespace moekit::cli
