// What moekit prints besides errors (STYLE 12): MOEKIT_LOG=warn prints the fallbacks that change
// no result but may cost time (a tuning cache ignored, a tuned tactic that cannot run);
// MOEKIT_LOG=debug also each selection decision. Unset (or any other value): nothing.
#pragma once

#include <cstdint>
#include <string_view>

namespace moekit::core {

enum class LogLevel : std::uint8_t { warn, debug };

bool log_enabled(LogLevel level);
// One line on stderr, "moekit: warn: message", when the level is enabled.
void log(LogLevel level, std::string_view message);

}  // namespace moekit::core
