// Which tuning cache a layer reads (LayerOptions::tuning, MOEKIT_TUNING_CACHE, the per-user
// default, the cache shipped with moekit for this GPU) and which of its entries apply to it: backend-neutral, the backends' steps name their
// tactics themselves (src/cuda/layer/tactic.h). docs/TUNE.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tuning_cache.h"
#include "moekit/layer.h"

namespace moekit::core {

// A cache as loaded: the file, where its name came from, and its entries or why there are none.
struct TuningSource {
  std::string file;    // the path read (or the name of given JSON); empty: none
  std::string origin;  // "LayerOptions::tuning", "MOEKIT_TUNING_CACHE", "the default path", "shipped ..."
  std::shared_ptr<const io::TuningCache> cache;  // null: none
  std::string problem;  // why there is no cache: "off", a missing default file, a parse error
  std::string to_string() const;
};

// $XDG_CACHE_HOME/moekit/tuning.json, else $HOME/.cache/moekit/tuning.json; empty without either.
std::string default_tuning_cache_path();
// Where the caches shipped with moekit lie: tuning/ beside the binary that holds this code (the
// moekit CLI in its build folder, the Python package's module moekit/_C), then
// ../share/moekit/tuning/ from that binary's folder (an installed CLI: PREFIX/bin/moekit).
std::vector<std::string> shipped_tuning_dirs();
// The shipped cache for `here`: the first *.json (by name) of the first of `dirs` holding one whose
// entries were measured on this GPU name and SM count. None: the reason, naming the GPU and `dirs`.
TuningSource shipped_tuning(const io::TuningDevice& here, const std::vector<std::string>& dirs);
// options (a file, JSON, or "off"), else MOEKIT_TUNING_CACHE, else the per-user default path when it
// exists, else the cache shipped for `here` (in shipped_tuning_dirs()). Never throws: a file that
// cannot be read or parsed gives no cache and the reason (logged at warn).
TuningSource load_tuning(const TuningOptions& options, const io::TuningDevice& here);

// The entries of one step that apply to this device and problem, by token bucket, and why the
// others did not (explain prints both).
class TunedTable {
 public:
  TunedTable() = default;
  TunedTable(const TuningSource& source, const io::TuningDevice& here, const io::TuningProblem& problem,
             std::string_view step);
  // The entry of T's bucket (a batch-invariant problem: the one for every T); null when none.
  const io::TuningEntry* find(std::int64_t tokens) const;
  const std::map<std::int64_t, io::TuningEntry>& entries() const { return entries_; }
  const std::string& file() const { return file_; }
  // Drops an entry (a backend's step found its tactic unusable), keeping the reason.
  void reject(std::int64_t tokens, const std::string& reason);
  // The source, then one line per rejection reason with its count.
  std::vector<std::string> report() const;

 private:
  void count(const std::string& reason);
  std::string file_, source_;
  bool batch_invariant_ = false;
  std::map<std::int64_t, io::TuningEntry> entries_;
  std::vector<std::pair<std::string, int>> rejected_;  // reason, entries (first seen first)
};

// The first key field in which `entry` differs from here and `problem`; empty when it applies.
std::string tuning_mismatch(const io::TuningEntry& entry, const io::TuningDevice& here, const io::TuningProblem& problem,
                            std::string_view step);

}  // namespace moekit::core
