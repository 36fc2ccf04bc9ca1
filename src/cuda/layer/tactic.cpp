#include "cuda/layer/tactic.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "cuda/common/device.h"
#include "cuda/layer/device_weights.h"
#include "cuda/layer/experts.h"
#include "cuda/layer/min_latency.h"
#include "moekit/moekit.h"

namespace moekit::cuda {
namespace {

// The most rows per group at which a decode GEMM is a candidate: past these it streams W once per
// 8 (rows8_warp_mma, tuned for <= 0.5), 8, 16 or 32 rows (tokens*_wgmma) where a 64-row tile
// streams it once per 64, and cannot win.
double max_rows_per_group(GemmTile tile) {
  switch (tile) {
    case GemmTile::rows8_warp_mma: return 8;
    case GemmTile::tokens8_n128_wgmma:
    case GemmTile::tokens8_n256_act:
    case GemmTile::tokens8_n128_combine: return 16;
    case GemmTile::tokens16_n128_wgmma:
    case GemmTile::tokens16_n256_act:
    case GemmTile::tokens16_n128_combine: return 32;
    case GemmTile::tokens32_n128_wgmma:
    case GemmTile::tokens32_n256_act: return 64;
    default: return 1e300;
  }
}

// The tiles a GEMM may take under its sums (GemmSums), besides the heuristic's own choice.
// Batch-invariant: tiles whose row sums do not change with the rows of the group (not the 192-row
// kernels fitted to a group's rows, nor the decode kernel).
std::vector<GemmTile> allowed_tiles(GemmKind kind, GemmSums sums, bool batch_invariant) {
  std::vector<GemmTile> tiles;
  switch (sums) {
    case GemmSums::tensor_core:
      tiles = {GemmTile::m128_n128_cooperative, GemmTile::m64_n128_pingpong};
      if (kind == GemmKind::fp8_channel && !batch_invariant) tiles.push_back(GemmTile::m192_n128_wgmma_k128);
      if (kind == GemmKind::fp8_block) {
        tiles.push_back(GemmTile::m128_n128_persistent);
        tiles.insert(tiles.end(), {GemmTile::m128_n160_persistent, GemmTile::m128_n128_persistent_tma,
                                   GemmTile::m128_n192_persistent_tma});
        tiles.push_back(GemmTile::m128_n192_persistent);
        tiles.push_back(GemmTile::m128_n256_persistent_act);  // GEMM1 of a gated layer (gemm_allowed)
        tiles.insert(tiles.end(), {GemmTile::m128_n128_persistent_x2, GemmTile::m128_n192_persistent_x2,
                                   GemmTile::m128_n256_persistent_act_x2});
        if (!batch_invariant)  // N fitted to the rows
          tiles.insert(tiles.end(), {GemmTile::tokens192_n128_persistent, GemmTile::tokens192_n128_persistent_x2});
      }
      break;
    case GemmSums::k32:
      tiles = {GemmTile::m64_n128_wgmma};
      if (kind == GemmKind::fp8_block) {
        tiles.push_back(GemmTile::m128_n128_persistent_k32);
      } else {
        tiles.push_back(GemmTile::m128_n128_wgmma);
        if (!batch_invariant) tiles.push_back(GemmTile::m192_n128_wgmma);
      }
      break;
    case GemmSums::f32: tiles = {GemmTile::m128_n128_f16, GemmTile::m64_n128_f16}; break;
  }
  if (kind == GemmKind::fp8_block && !batch_invariant) {
    tiles.push_back(GemmTile::rows8_warp_mma);
    // moekit's decode WGMMA kernels sum 128 of K in the tensor core, as CUTLASS's tiles do.
    if (sums == GemmSums::tensor_core)
      tiles.insert(tiles.end(), {GemmTile::tokens8_n128_wgmma, GemmTile::tokens16_n128_wgmma, GemmTile::tokens32_n128_wgmma,
                                 GemmTile::tokens8_n256_act, GemmTile::tokens16_n256_act, GemmTile::tokens32_n256_act,
                                 GemmTile::tokens8_n128_combine, GemmTile::tokens16_n128_combine});
  }
  return tiles;
}

// The fewest rows per group at which a tile is a candidate: the persistent 128-row tiles are for
// prefill; below 16 rows per group a tile would be 7/8 padding, and the tuner's budget goes elsewhere.
double min_rows_per_group(GemmTile tile) {
  switch (tile) {
    case GemmTile::m128_n128_persistent:
    case GemmTile::m128_n160_persistent:
    case GemmTile::m128_n192_persistent:
    case GemmTile::m128_n128_persistent_tma:
    case GemmTile::m128_n192_persistent_tma:
    case GemmTile::m128_n256_persistent_act:
    case GemmTile::tokens192_n128_persistent:
    case GemmTile::m128_n128_persistent_k32:
    case GemmTile::m128_n128_persistent_x2:
    case GemmTile::m128_n192_persistent_x2:
    case GemmTile::m128_n256_persistent_act_x2:
    case GemmTile::tokens192_n128_persistent_x2: return 16;
    default: return 0;
  }
}

// The tile a variant tile varies (else the tile itself): the persistent tiles on 2-block clusters
// and with TMA stores, the decode GEMM2 with the combine. Candidates take the base tiles; the tuner
// times the variants of the three fastest candidates that bring new ones (tactic_variants,
// core::kVariantLeaders).
GemmTile base_tile(GemmTile tile) {
  switch (tile) {
    case GemmTile::m128_n128_persistent_x2:
    case GemmTile::m128_n128_persistent_tma: return GemmTile::m128_n128_persistent;
    case GemmTile::m128_n192_persistent_x2:
    case GemmTile::m128_n192_persistent_tma: return GemmTile::m128_n192_persistent;
    case GemmTile::m128_n256_persistent_act_x2: return GemmTile::m128_n256_persistent_act;
    case GemmTile::tokens192_n128_persistent_x2: return GemmTile::tokens192_n128_persistent;
    case GemmTile::tokens8_n128_combine: return GemmTile::tokens8_n128_wgmma;
    case GemmTile::tokens16_n128_combine: return GemmTile::tokens16_n128_wgmma;
    default: return tile;
  }
}

// The tile and its variants.
std::vector<GemmTile> with_variants(GemmTile tile) {
  std::vector<GemmTile> out{tile};
  for (const GemmTile t : kAllGemmTiles)
    if (t != tile && base_tile(t) == tile) out.push_back(t);
  return out;
}

// The decode tile's twin that activates and requantizes GEMM1's rows itself (else the tile).
GemmTile activated_decode(GemmTile tile) {
  switch (tile) {
    case GemmTile::tokens8_n128_wgmma: return GemmTile::tokens8_n256_act;
    case GemmTile::tokens16_n128_wgmma: return GemmTile::tokens16_n256_act;
    case GemmTile::tokens32_n128_wgmma: return GemmTile::tokens32_n256_act;
    default: return tile;
  }
}

min_latency::Problem min_latency_problem(const TacticProblem& p) {
  min_latency::Problem m;
  m.config = p.config;
  m.tokens = p.tokens;
  return m;
}

struct PathChoice {
  TacticPath path;
  std::string reason;
};

PathChoice heuristic_path(const TacticProblem& p) {
  if (p.expert_parallel) return {TacticPath::staged, "staged path: expert parallelism combines in its own pipeline"};
  const min_latency::Choice c = min_latency::choose(min_latency_problem(p));
  return {c.taken ? TacticPath::min_latency : TacticPath::staged, c.reason};
}

Status gemm_allowed(const char* which, GroupedGemmDesc desc, GemmTile tile, const StagedGemms& g, GemmSums sums,
                    const MoEConfig& c) {
  // The activation fused into GEMM1 (its stage then skipped) needs a gated activation.
  if (output_of(tile) == GemmOutput::activated_fp8 && !c.gated())
    return Status::no(std::string(which) + " " + std::string(tile_id(tile)) + ": the activation is not gated");
  desc.output = output_of(tile);
  const std::vector<GemmTile> tiles = allowed_tiles(desc.kind, sums, c.batch_invariant);
  const bool listed = std::find(tiles.begin(), tiles.end(), tile) != tiles.end();
  if (!listed && choose_gemm_config(desc, g.rows_per_group, sums, c.batch_invariant).config.tile != tile)
    return Status::no(std::string(which) + " " + std::string(tile_id(tile)) + ": does not sum as " +
                      std::string(to_string(c.quant.accumulation)) + " accumulation" +
                      (c.batch_invariant ? " with batch invariance" : "") + " needs");
  if (Status s = can_implement(desc, {tile}); !s) return Status::no(std::string(which) + ": " + s.reason());
  return Status::ok();
}

}  // namespace

std::string_view tile_id(GemmTile tile) {
  switch (tile) {
    case GemmTile::m128_n128_cooperative: return "m128_n128_cooperative";
    case GemmTile::m64_n128_pingpong: return "m64_n128_pingpong";
    case GemmTile::rows8_warp_mma: return "rows8_warp_mma";
    case GemmTile::m192_n128_wgmma: return "m192_n128_wgmma";
    case GemmTile::m128_n128_wgmma: return "m128_n128_wgmma";
    case GemmTile::m64_n128_wgmma: return "m64_n128_wgmma";
    case GemmTile::m192_n128_wgmma_k128: return "m192_n128_wgmma_k128";
    case GemmTile::m128_n128_f16: return "m128_n128_f16";
    case GemmTile::m64_n128_f16: return "m64_n128_f16";
    case GemmTile::tokens8_n128_wgmma: return "tokens8_n128_wgmma";
    case GemmTile::tokens16_n128_wgmma: return "tokens16_n128_wgmma";
    case GemmTile::tokens32_n128_wgmma: return "tokens32_n128_wgmma";
    case GemmTile::m128_n128_persistent: return "m128_n128_persistent";
    case GemmTile::m128_n160_persistent: return "m128_n160_persistent";
    case GemmTile::m128_n128_persistent_tma: return "m128_n128_persistent_tma";
    case GemmTile::m128_n192_persistent_tma: return "m128_n192_persistent_tma";
    case GemmTile::m128_n192_persistent: return "m128_n192_persistent";
    case GemmTile::m128_n256_persistent_act: return "m128_n256_persistent_act";
    case GemmTile::tokens192_n128_persistent: return "tokens192_n128_persistent";
    case GemmTile::m128_n128_persistent_k32: return "m128_n128_persistent_k32";
    case GemmTile::tokens8_n256_act: return "tokens8_n256_act";
    case GemmTile::tokens16_n256_act: return "tokens16_n256_act";
    case GemmTile::tokens32_n256_act: return "tokens32_n256_act";
    case GemmTile::m128_n128_persistent_x2: return "m128_n128_persistent_x2";
    case GemmTile::m128_n192_persistent_x2: return "m128_n192_persistent_x2";
    case GemmTile::m128_n256_persistent_act_x2: return "m128_n256_persistent_act_x2";
    case GemmTile::tokens192_n128_persistent_x2: return "tokens192_n128_persistent_x2";
    case GemmTile::tokens8_n128_combine: return "tokens8_n128_combine";
    case GemmTile::tokens16_n128_combine: return "tokens16_n128_combine";
  }
  return "";
}

std::string Tactic::name() const {
  if (path == TacticPath::min_latency) return "min-latency";
  return "staged gemm1=" + std::string(tile_id(gemm1.tile)) + " gemm2=" + std::string(tile_id(gemm2.tile));
}

std::string Tactic::to_string() const {
  if (path == TacticPath::min_latency) return name() + " (quantize+plan, gemm1+activation, gemm2+combine)";
  return name() + " (GEMM1 " + gemm1.to_string() + ", GEMM2 " + gemm2.to_string() + ")";
}

std::optional<Tactic> parse_tactic(std::string_view name) {
  if (name == "min-latency") return Tactic{TacticPath::min_latency, {}, {}};
  auto tile = [](std::string_view id) -> std::optional<GemmTile> {
    for (const GemmTile t : kAllGemmTiles)
      if (tile_id(t) == id) return t;
    return std::nullopt;
  };
  constexpr std::string_view prefix = "staged gemm1=", middle = " gemm2=";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  const std::size_t at = name.find(middle);
  if (at == std::string_view::npos) return std::nullopt;
  const auto g1 = tile(name.substr(0, at)), g2 = tile(name.substr(at + middle.size()));
  if (!g1 || !g2) return std::nullopt;
  return Tactic{TacticPath::staged, {*g1}, {*g2}};
}

StagedGemms staged_gemms(const TacticProblem& p) {
  const MoEConfig& c = p.config;
  const GemmKind kind = gemm_kind(c.quant.scheme);
  const std::int64_t el = c.local_experts(), data_rows = p.tokens * c.top_k();
  StagedGemms g;
  g.gemm1 = {kind, el, c.gemm1_width(), c.hidden_size, p.max_rows, data_rows};
  g.gemm2 = {kind, el, c.hidden_size, c.intermediate_size, p.max_rows, data_rows};
  // GEMM1's output is requantized (FP8 schemes), GEMM2's is the result.
  g.sums1 = gemm_sums(kind, c.quant.accumulation, true);
  g.sums2 = gemm_sums(kind, c.quant.accumulation, false);
  g.rows_per_group = double(data_rows) / double(c.num_experts);
  return g;
}

Status can_implement(const Tactic& t, const TacticProblem& p) {
  const ExpertsPath forced = p.config.experts_path;
  if (t.path == TacticPath::min_latency) {
    if (p.expert_parallel) return Status::no("min-latency path: not inside the expert-parallel pipeline");
    if (forced == ExpertsPath::staged) return Status::no("min-latency path: the layer's path is staged (--path staged)");
    return min_latency::can_implement(min_latency_problem(p));
  }
  if (forced == ExpertsPath::min_latency) return Status::no("staged path: the layer's path is min-latency (--path min-latency)");
  const StagedGemms g = staged_gemms(p);
  if (output_of(t.gemm1.tile) == GemmOutput::combined)
    return Status::no("GEMM1 " + std::string(tile_id(t.gemm1.tile)) + ": combines GEMM2's rows, not GEMM1's");
  if (Status s = gemm_allowed("GEMM1", g.gemm1, t.gemm1.tile, g, g.sums1, p.config); !s) return s;
  if (output_of(t.gemm2.tile) == GemmOutput::activated_fp8)
    return Status::no("GEMM2 " + std::string(tile_id(t.gemm2.tile)) + ": activates GEMM1's output, not GEMM2's");
  if (output_of(t.gemm2.tile) == GemmOutput::combined) {
    // The combine's counts are zeroed by the one-block permutation plan; the EP pipeline combines itself.
    if (p.expert_parallel) return Status::no("GEMM2 + combine: not inside the expert-parallel pipeline (it combines itself)");
    if (!plan_takes_one_block(p.config, p.tokens))
      return Status::no("GEMM2 + combine: needs the one-block permutation plan (T k <= its slots), T=" + std::to_string(p.tokens));
  }
  return gemm_allowed("GEMM2", g.gemm2, t.gemm2.tile, g, g.sums2, p.config);
}

TacticChoice heuristic_tactic(const TacticProblem& p) {
  const PathChoice path = heuristic_path(p);
  if (path.path == TacticPath::min_latency) return {Tactic{TacticPath::min_latency, {}, {}}, nullptr, path.reason};
  const StagedGemms g = staged_gemms(p);
  const bool invariant = p.config.batch_invariant;
  GemmChoice g1 = choose_gemm_config(g.gemm1, g.rows_per_group, g.sums1, invariant);
  // The decode kernel's GEMM1 with the activation in its epilogue, where the layer's activation is
  // gated: the tuner chose it at 15 of the presets' 21 buckets from T=1 to 512, 2-13% faster than
  // the bf16 tiles and the activation stage, and never measurably slower (docs/PERF.md, 2026-12-04).
  const GemmTile act = activated_decode(g1.config.tile);
  if (act != g1.config.tile && gemm_allowed("GEMM1", g.gemm1, act, g, g.sums1, p.config)) {
    g1.config.tile = act;
    g1.reason += "; the activation and requantization in its epilogue";
  }
  const GemmChoice g2 = choose_gemm_config(g.gemm2, g.rows_per_group, g.sums2, invariant);
  return {Tactic{TacticPath::staged, g1.config, g2.config}, nullptr,
          path.reason + "; GEMM1: " + g1.reason + "; GEMM2: " + g2.reason};
}

std::vector<Tactic> candidate_tactics(const TacticProblem& p) {
  const Tactic heuristic = heuristic_tactic(p).tactic;
  std::vector<Tactic> out;
  auto add = [&](const Tactic& t) {
    if (std::find(out.begin(), out.end(), t) == out.end() && can_implement(t, p)) out.push_back(t);
  };
  add(heuristic);
  add(Tactic{TacticPath::min_latency, {}, {}});
  const StagedGemms g = staged_gemms(p);
  const bool invariant = p.config.batch_invariant;
  auto tiles = [&](const GroupedGemmDesc& desc, GemmSums sums) {
    std::vector<GemmTile> t = allowed_tiles(desc.kind, sums, invariant);
    std::erase_if(t, [&](GemmTile tile) {
      return base_tile(tile) != tile || g.rows_per_group > max_rows_per_group(tile) ||
             g.rows_per_group < min_rows_per_group(tile);
    });
    return t;
  };
  for (GemmTile t1 : tiles(g.gemm1, g.sums1))
    for (GemmTile t2 : tiles(g.gemm2, g.sums2)) add(Tactic{TacticPath::staged, {t1}, {t2}});
  return out;
}

std::vector<Tactic> tactic_variants(const Tactic& t, const TacticProblem& p) {
  std::vector<Tactic> out;
  if (t.path != TacticPath::staged) return out;
  for (const GemmTile t1 : with_variants(t.gemm1.tile))
    for (const GemmTile t2 : with_variants(t.gemm2.tile)) {
      const Tactic v{TacticPath::staged, {t1}, {t2}};
      if (!(v == t) && can_implement(v, p)) out.push_back(v);
    }
  return out;
}

io::TuningDevice this_device() {
  const DeviceInfo& info = device_info();
  io::TuningDevice d;
  d.gpu = info.count > 0 ? info.name : "none";
  d.sms = info.count > 0 ? info.multiprocessors : 0;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    cudaGetLastError();
    runtime = 0;
  }
  d.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  d.moekit = std::string(version());
  return d;
}

TacticChooser::TacticChooser(const MoEConfig& config, const TuningOptions* options)
    : TacticChooser(config, options ? core::load_tuning(*options, this_device()) : core::TuningSource{{}, {}, nullptr, "not read"},
                    this_device()) {}

TacticChooser::TacticChooser(const MoEConfig& config, const core::TuningSource& source, const io::TuningDevice& here)
    : table_(source, here, io::TuningProblem::of(config), "experts") {
  std::vector<std::pair<std::int64_t, std::string>> unknown;
  for (const auto& [tokens, entry] : table_.entries()) {
    if (const std::optional<Tactic> t = parse_tactic(entry.winner.tactic)) tactics_.emplace(tokens, *t);
    else unknown.emplace_back(tokens, "tactic '" + entry.winner.tactic + "' is not one of this build's");
  }
  for (const auto& [tokens, why] : unknown) table_.reject(tokens, why);
  if (core::log_enabled(core::LogLevel::debug))
    for (const std::string& line : table_.report()) core::log(core::LogLevel::debug, "experts: " + line);
}

TacticChoice TacticChooser::choose(const TacticProblem& p) const {
  const io::TuningEntry* entry = p.tokens > 0 ? table_.find(p.tokens) : nullptr;
  if (!entry) return heuristic_tactic(p);
  const Tactic& tuned = tactics_.at(entry->tokens);
  const Status s = can_implement(tuned, p);
  if (s) return {tuned, entry, ""};
  TacticChoice h = heuristic_tactic(p);
  const std::string why = "the tuned " + tuned.name() + " cannot run at T=" + std::to_string(p.tokens) + ": " + s.reason();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (warned_.insert(entry->tokens).second)
      core::log(core::LogLevel::warn, table_.file() + ": " + why + "; the heuristic's " + h.tactic.name() + " runs");
  }
  h.reason = why + "; " + h.reason;
  return h;
}

std::string describe(const TacticChoice& choice, const std::string& file) {
  if (!choice.tuned) return "heuristic (" + choice.reason + ")";
  char us[32];
  std::snprintf(us, sizeof us, "%.1f us", choice.tuned->winner.us);
  std::string s = "tuned (" + file + ", " + us;
  if (!choice.tuned->runners_up.empty()) {
    const io::TunedTime& r = choice.tuned->runners_up.front();
    std::snprintf(us, sizeof us, "%.1f us", r.us);
    s += "; runner-up " + r.tactic + " " + us;
  }
  return s + ")";
}

}  // namespace moekit::cuda
