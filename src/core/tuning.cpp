#include "core/tuning.h"

#include <link.h>

#include <algorithm>
#include <cstdint>
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

// The file of the loaded object (executable or shared library) that holds this code: moekit is a
// static library, linked into the CLI, the tests or the Python module. Empty when not found.
std::filesystem::path binary_of_this_code() {
  struct Search {
    std::uintptr_t address;
    std::string file;
    bool found = false;
  } search{reinterpret_cast<std::uintptr_t>(&binary_of_this_code), {}, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto& s = *static_cast<Search*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && s.address >= start && s.address < start + ph.p_memsz) {
            s.file = info->dlpi_name ? info->dlpi_name : "";
            s.found = true;
            return 1;
          }
        }
        return 0;
      },
      &search);
  if (!search.found) return {};
  std::error_code ec;
  // The main program has no name in the loader's list: it is the process's executable.
  const std::filesystem::path file = search.file.empty() ? std::filesystem::read_symlink("/proc/self/exe", ec)
                                                         : std::filesystem::path(search.file);
  if (ec) return {};
  const std::filesystem::path absolute = std::filesystem::weakly_canonical(file, ec);
  return ec ? file : absolute;
}

// Whether any entry of `cache` was measured on this GPU model and SM count.
bool measured_on(const io::TuningCache& cache, const io::TuningDevice& here) {
  return std::any_of(cache.entries.begin(), cache.entries.end(),
                     [&](const io::TuningEntry& e) { return e.device.gpu == here.gpu && e.device.sms == here.sms; });
}

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

std::vector<std::string> shipped_tuning_dirs() {
  const std::filesystem::path binary = binary_of_this_code();
  if (binary.empty()) return {};
  const std::filesystem::path dir = binary.parent_path();
  return {(dir / "tuning").string(), (dir.parent_path() / "share" / "moekit" / "tuning").string()};
}

TuningSource shipped_tuning(const io::TuningDevice& here, const std::vector<std::string>& dirs) {
  TuningSource s;
  std::string looked;
  for (const std::string& dir : dirs) {
    looked += (looked.empty() ? "" : ", ") + dir;
    std::error_code ec;  // a folder that is missing or cannot be read holds no cache
    std::vector<std::filesystem::path> files;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".json") files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const std::filesystem::path& file : files) {
      try {
        auto cache = std::make_shared<const io::TuningCache>(io::read_tuning_cache(file.string()));
        if (!measured_on(*cache, here)) continue;
        s.file = file.string();
        s.origin = "shipped with moekit for " + here.gpu + " with " + std::to_string(here.sms) + " SMs";
        s.cache = std::move(cache);
        return s;
      } catch (const Error& e) {
        log(LogLevel::warn, std::string("shipped tuning cache skipped: ") + e.what());
      }
    }
  }
  s.problem = "none shipped for " + quoted(here.gpu) + " with " + std::to_string(here.sms) + " SMs in " +
              (looked.empty() ? std::string("(no folder: moekit's binary not found)") : looked);
  return s;
}

TuningSource load_tuning(const TuningOptions& options, const io::TuningDevice& here) {
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
      // Nothing the user chose: the cache shipped for this GPU, if any.
      const std::string why = file.empty() ? "no per-user path (neither XDG_CACHE_HOME nor HOME is set)"
                                           : "no per-user cache at " + file;
      if (here.sms <= 0) return {"", "", nullptr, why + "; no GPU, so no shipped cache"};
      s = shipped_tuning(here, shipped_tuning_dirs());
      if (s.cache) s.origin += "; MOEKIT_TUNING_CACHE unset, " + why;
      else s.problem = why + "; " + s.problem;
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
    return s;
  }
  // A cache measured on other GPUs applies nowhere here (each entry names its GPU): say so where it
  // is reported, not only entry by entry.
  if (here.sms > 0 && !measured_on(*s.cache, here)) {
    s.origin += "; no entry of it was measured on " + quoted(here.gpu) + " with " + std::to_string(here.sms) +
                " SMs, so the heuristic decides";
    log(LogLevel::warn, "tuning cache " + s.file + ": " + s.origin);
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
