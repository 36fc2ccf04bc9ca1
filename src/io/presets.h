// Model presets of DESIGN §9, from each model's public config.json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"

namespace moekit::io {

struct Preset {
  std::string name;
  MoEConfig config;  // with the preset's default quant
  std::string note;
};

const std::vector<Preset>& presets();
// Error naming `preset` and listing the names when unknown.
const Preset& find_preset(std::string_view name);
// The table `moekit presets` prints.
std::string presets_table();

}  // namespace moekit::io
