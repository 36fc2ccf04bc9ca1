// Model presets of DESIGN §9, from each model's public config.json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"

namespace moekit::io {

struct Preset {
  std::string name;
  MoEConfig config;  // with the preset's default quant, without shared experts
  std::string note;
  // The model's shared experts (n_shared_experts), which a layer takes when asked (`--shared-experts N`,
  // with_shared): off by default, so that a preset stays the routed layer that moekit's records, its
  // tuning caches and the peers it is compared with (vLLM's fused_moe, DeepGEMM) all measure.
  std::int64_t shared_experts = 0;
};

// The preset's config with `shared` shared experts: 0, or the model's count (an Error naming
// shared_experts otherwise).
MoEConfig with_shared(const Preset& preset, std::int64_t shared);

const std::vector<Preset>& presets();
// Error naming `preset` and listing the names when unknown.
const Preset& find_preset(std::string_view name);
// The table `moekit presets` prints.
std::string presets_table();

}  // namespace moekit::io
