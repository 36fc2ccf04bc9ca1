#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace moekit::core {
namespace {

int enabled_level() {
  static const int level = [] {
    const char* v = std::getenv("MOEKIT_LOG");
    const std::string s = v ? v : "";
    if (s == "debug") return int(LogLevel::debug);
    if (s == "warn") return int(LogLevel::warn);
    return -1;
  }();
  return level;
}

}  // namespace

bool log_enabled(LogLevel level) { return int(level) <= enabled_level(); }

void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  std::fprintf(stderr, "moekit: %s: %.*s\n", level == LogLevel::warn ? "warn" : "debug", int(message.size()),
               message.data());
}

}  // namespace moekit::core
