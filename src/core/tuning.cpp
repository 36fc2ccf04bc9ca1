#include "core/tuning.h"

#include <cstdlib>
#include <filesystem>

#include "core/log.h"
#include "moekit/error.h"

namespace moekit::core {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

std::string TuningSource::to_string() const {
  if (!cache) return "none (" + problem + ")";
  return file + " (" + origin + "): " + std::to_string(cache->entries.size()) + " entries";
}

std::string default_tuning_cache_path() {
  const std::string xdg = env("XDG_CACHE_HOME"), home = env("HOME");
  if (!xdg.empty()) return xdg + "/moekit/tuning.json";
  if (!home.empty()) return home + "/.cache/moekit/tuning.json";
  return "";
}

TuningSource load_tuning(const TuningOptions& options) {
  TuningSource s;
  std::string file = options.cache;
  s.origin = "LayerOptions::tuning";
  if (file.empty() && options.json.empty()) {
    file = env("MOEKIT_TUNING_CACHE");
    s.origin = "MOEKIT_TUNING_CACHE";
  }
  if (file == "off") {
    s.problem = "off (" + s.origin + ")";
    return s;
  }
  if (file.empty() && options.json.empty()) {
    file = default_tuning_cache_path();
    s.origin = "the default path";
    std::error_code ec;
    if (file.empty() || !std::filesystem::exists(file, ec)) {
      s.problem = file.empty() ? "no default path: neither XDG_CACHE_HOME nor HOME is set"
                               : "the default path " + file + " does not exist";
      return s;
    }
  }
  s.file = file.empty() ? "the given JSON" : file;
  try {
    s.cache = std::make_shared<const io::TuningCache>(options.json.empty() ? io::read_tuning_cache(file)
                                                                           : io::parse_tuning_cache(options.json, s.file));
  } catch (const Error& e) {
    s.problem = std::string("rejected: ") + e.what();
    log(LogLevel::warn, "tuning cache " + s.file + " (" + s.origin + ") ignored, the heuristic decides: " + e.what());
  }
  return s;
}

std::string tuning_mismatch(const io::TuningEntry& e, const io::TuningDevice& here, const io::TuningProblem& problem,
                            std::string_view step) {
  const io::TuningDevice& d = e.device;
  if (d.gpu != here.gpu) return "GPU " + quoted(d.gpu) + " != " + quoted(here.gpu);
  if (d.sms != here.sms) return "SMs " + std::to_string(d.sms) + " != " + std::to_string(here.sms);
  if (d.cuda != here.cuda) return "CUDA " + d.cuda + " != " + here.cuda;
  if (d.moekit != here.moekit) return "moekit " + d.moekit + " != " + here.moekit;
  if (std::string why = problem.difference(e.problem); !why.empty()) return "problem: " + why;
  if (e.step != step) return "step " + e.step + " != " + std::string(step);
  return "";
}

TunedTable::TunedTable(const TuningSource& source, const io::TuningDevice& here, const io::TuningProblem& problem,
                       std::string_view step)
    : file_(source.file), source_(source.to_string()), batch_invariant_(problem.batch_invariant) {
  if (!source.cache) return;
  for (const io::TuningEntry& e : source.cache->entries) {
    const std::string why = tuning_mismatch(e, here, problem, step);
    if (why.empty()) entries_.emplace(e.tokens, e);
    else count(why);
  }
}

const io::TuningEntry* TunedTable::find(std::int64_t tokens) const {
  const auto it = entries_.find(batch_invariant_ ? 0 : io::token_bucket(tokens));
  return it == entries_.end() ? nullptr : &it->second;
}

void TunedTable::reject(std::int64_t tokens, const std::string& reason) {
  if (entries_.erase(tokens)) count(reason);
}

void TunedTable::count(const std::string& reason) {
  for (auto& [why, n] : rejected_)
    if (why == reason) {
      ++n;
      return;
    }
  rejected_.emplace_back(reason, 1);
}

std::vector<std::string> TunedTable::report() const {
  std::vector<std::string> lines{"tuning cache: " + source_ + (entries_.empty() ? "" : ", " + std::to_string(entries_.size()) +
                                                                                       " apply to this layer")};
  for (const auto& [why, n] : rejected_)
    lines.push_back("  ignored " + std::to_string(n) + (n == 1 ? " entry: " : " entries: ") + why);
  return lines;
}

}  // namespace moekit::core
