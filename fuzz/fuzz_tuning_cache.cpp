// The tuning cache reader (src/io/tuning_cache.h) on arbitrary text, then the lookup a layer
// makes (core/tuning.h) against a fixed GPU and problem. A cache it accepts must survive a round
// trip: written back and parsed again, it writes the same text. Only moekit::Error may come out.
#include <cstdio>
#include <string>

#include "core/tuning.h"
#include "io/tuning_cache.h"
#include "moekit/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moekit;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  io::TuningCache cache;
  try {
    cache = io::parse_tuning_cache(text, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  const std::string written = io::write_tuning_cache(cache);
  std::string again;
  try {
    again = io::write_tuning_cache(io::parse_tuning_cache(written, "round trip"));
  } catch (const Error& e) {
    std::fprintf(stderr, "round trip refused: %s\n%s\n", e.what(), written.c_str());
    __builtin_trap();
  }
  if (again != written) {
    std::fprintf(stderr, "round trip changed the cache:\n%s\n%s\n", written.c_str(), again.c_str());
    __builtin_trap();
  }
  // The lookup of every bucket, for a problem of the first entry (when there is one) and a GPU.
  core::TuningSource source;
  source.file = "fuzz";
  source.cache = std::make_shared<const io::TuningCache>(cache);
  const io::TuningDevice here{"NVIDIA H200", 132, "13.0", "0.1.0"};
  const io::TuningProblem problem = cache.entries.empty() ? io::TuningProblem{} : cache.entries.front().problem;
  core::TunedTable table(source, here, problem, "experts");
  for (std::int64_t t = 1; t <= io::kTuningMaxTokens; t *= 2) (void)table.find(t);
  (void)table.report();
  return 0;
}
