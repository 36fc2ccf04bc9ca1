#include "io/tuning_cache.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <tuple>

#include "io/json.h"
#include "moekit/error.h"

namespace moekit::io {
namespace {

constexpr std::string_view kFormat = "moekit-tuning";
constexpr std::int64_t kFormatVersion = 1;
constexpr std::size_t kMaxString = 256;  // names, versions, tactics
constexpr std::size_t kMaxNote = 4096;   // `measured`

// Reads an object's members, each exactly once, and refuses members it does not know.
class Fields {
 public:
  Fields(const JsonValue& value, std::string what) : what_(std::move(what)) {
    for (const auto& member : value.as_object(what_)) known_.insert(member.first);
    value_ = &value;
  }
  const JsonValue& required(std::string_view key) {
    const JsonValue* v = value_->get(key);
    require(v != nullptr, what_ + ": missing \"" + std::string(key) + "\"");
    known_.erase(std::string(key));
    return *v;
  }
  const JsonValue* optional(std::string_view key) {
    known_.erase(std::string(key));
    return value_->get(key);
  }
  std::string string(std::string_view key, std::size_t max = kMaxString) {
    const std::string& s = required(key).as_string(name(key));
    require(s.size() <= max, name(key) + ": expected at most " + std::to_string(max) + " bytes, given " +
                                 std::to_string(s.size()));
    return s;
  }
  std::int64_t integer(std::string_view key, std::int64_t lo, std::int64_t hi) { return required(key).as_int(name(key), lo, hi); }
  // Unknown members are a flaw: a misspelt key must not pass as a default.
  void finish() const {
    require(known_.empty(), what_ + ": unknown member \"" + (known_.empty() ? "" : *known_.begin()) + "\"");
  }
  std::string name(std::string_view key) const { return what_ + "." + std::string(key); }

 private:
  const JsonValue* value_ = nullptr;
  std::string what_;
  std::set<std::string> known_;
};

ScaleFormat parse_scale_format(std::string_view text, const std::string& what) {
  if (text == "f32") return ScaleFormat::f32;
  if (text == "ue8m0") return ScaleFormat::ue8m0;
  throw Error(what + ": expected one of f32|ue8m0, given '" + std::string(text.substr(0, 64)) + "'");
}

TuningDevice parse_device(Fields& f) {
  TuningDevice d;
  d.gpu = f.string("gpu");
  d.sms = int(f.integer("sms", 1, 1 << 16));
  d.cuda = f.string("cuda");
  d.moekit = f.string("moekit");
  return d;
}

TuningProblem parse_problem(const JsonValue& v, const std::string& what) {
  Fields f(v, what);
  TuningProblem p;
  p.experts = f.integer("experts", 1, 1 << 20);
  p.hidden = f.integer("hidden", 1, 1 << 24);
  p.intermediate = f.integer("intermediate", 1, 1 << 24);
  p.top_k = f.integer("top_k", 1, 1 << 20);
  p.ep_size = int(f.integer("ep_size", 1, 1 << 16));
  p.activation = parse_activation(f.string("activation"), f.name("activation"));
  p.quant = parse_quant_scheme(f.string("quant"), f.name("quant"));
  p.scale_format = parse_scale_format(f.string("scale_format"), f.name("scale_format"));
  p.accumulation = parse_fp8_accumulation(f.string("fp8_accumulation"), f.name("fp8_accumulation"));
  p.batch_invariant = f.required("batch_invariant").as_bool(f.name("batch_invariant"));
  f.finish();
  return p;
}

TunedTime parse_time(const JsonValue& v, const std::string& what) {
  Fields f(v, what);
  TunedTime t;
  t.tactic = f.string("tactic");
  require(!t.tactic.empty(), what + ".tactic: expected a name, given \"\"");
  t.us = f.required("us").as_number(f.name("us"));
  require(std::isfinite(t.us) && t.us > 0 && t.us < 1e12, f.name("us") + ": expected a time in (0, 1e12) us");
  f.finish();
  return t;
}

TuningEntry parse_entry(const JsonValue& v, const std::string& what) {
  Fields f(v, what);
  TuningEntry e;
  e.device = parse_device(f);
  e.problem = parse_problem(f.required("problem"), f.name("problem"));
  e.step = f.string("step");
  require(e.step == "experts", f.name("step") + ": expected \"experts\", given '" + e.step + "'");
  e.tokens = f.integer("tokens", 0, kTuningMaxTokens);
  if (e.problem.batch_invariant)
    require(e.tokens == 0, f.name("tokens") + ": a batch-invariant problem keeps one tactic for every T: expected 0, given " +
                               std::to_string(e.tokens));
  else
    require(e.tokens > 0 && token_bucket(e.tokens) == e.tokens,
            f.name("tokens") + ": expected a power of two (a token bucket), given " + std::to_string(e.tokens));
  e.winner = parse_time(f.required("winner"), f.name("winner"));
  if (const JsonValue* r = f.optional("runners_up")) {
    const auto& items = r->as_array(f.name("runners_up"));
    require(items.size() <= kTuningMaxRunnersUp,
            f.name("runners_up") + ": expected at most " + std::to_string(kTuningMaxRunnersUp) + " items");
    for (std::size_t i = 0; i < items.size(); ++i)
      e.runners_up.push_back(parse_time(items[i], f.name("runners_up") + "[" + std::to_string(i) + "]"));
  }
  if (f.optional("measured")) e.measured = f.string("measured", kMaxNote);
  f.finish();
  return e;
}

// What makes two entries the same slot of the cache.
auto slot(const TuningEntry& e) {
  const TuningProblem& p = e.problem;
  return std::make_tuple(e.device.gpu, e.device.sms, e.device.cuda, e.device.moekit, p.experts, p.hidden,
                         p.intermediate, p.top_k, p.ep_size, int(p.activation), int(p.quant), int(p.scale_format),
                         int(p.accumulation), p.batch_invariant, e.step, e.tokens);
}

std::string number(double v) {
  char buffer[64];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, r.ptr);
}

std::string time_json(const TunedTime& t) {
  return "{\"tactic\": " + json_quote(t.tactic) + ", \"us\": " + number(t.us) + "}";
}

}  // namespace

std::string TuningDevice::to_string() const {
  return gpu + " (" + std::to_string(sms) + " SMs), CUDA " + cuda + ", moekit " + moekit;
}

TuningProblem TuningProblem::of(const MoEConfig& c) {
  TuningProblem p;
  p.experts = c.num_experts;
  p.hidden = c.hidden_size;
  p.intermediate = c.intermediate_size;
  p.top_k = c.top_k();
  p.ep_size = c.ep_size;
  p.activation = c.activation;
  p.quant = c.quant.scheme;
  p.scale_format = c.quant.scale_format;
  p.accumulation = c.quant.accumulation;
  p.batch_invariant = c.batch_invariant;
  return p;
}

std::string TuningProblem::to_string() const {
  return "E=" + std::to_string(experts) + " H=" + std::to_string(hidden) + " I=" + std::to_string(intermediate) +
         " k=" + std::to_string(top_k) + (ep_size > 1 ? " ep=" + std::to_string(ep_size) : "") + " " +
         std::string(moekit::to_string(activation)) + " " + std::string(moekit::to_string(quant)) +
         (scale_format == ScaleFormat::ue8m0 ? " ue8m0" : "") + " " + std::string(moekit::to_string(accumulation)) +
         (batch_invariant ? " batch-invariant" : "");
}

std::string TuningProblem::difference(const TuningProblem& o) const {
  auto differ = [](std::string_view name, const auto& theirs, const auto& ours) {
    return std::string(name) + " " + theirs + " != " + ours;
  };
  using std::to_string;
  using moekit::to_string;
  if (o.experts != experts) return differ("E", to_string(o.experts), to_string(experts));
  if (o.hidden != hidden) return differ("H", to_string(o.hidden), to_string(hidden));
  if (o.intermediate != intermediate) return differ("I", to_string(o.intermediate), to_string(intermediate));
  if (o.top_k != top_k) return differ("k", to_string(o.top_k), to_string(top_k));
  if (o.ep_size != ep_size) return differ("ep_size", to_string(o.ep_size), to_string(ep_size));
  if (o.activation != activation)
    return differ("activation", std::string(to_string(o.activation)), std::string(to_string(activation)));
  if (o.quant != quant) return differ("quant", std::string(to_string(o.quant)), std::string(to_string(quant)));
  if (o.scale_format != scale_format)
    return differ("scale format", std::string(to_string(o.scale_format)), std::string(to_string(scale_format)));
  if (o.accumulation != accumulation)
    return differ("fp8 accumulation", std::string(to_string(o.accumulation)), std::string(to_string(accumulation)));
  if (o.batch_invariant != batch_invariant)
    return differ("batch_invariant", std::string(o.batch_invariant ? "true" : "false"),
                  std::string(batch_invariant ? "true" : "false"));
  return "";
}

std::int64_t token_bucket(std::int64_t tokens) {
  if (tokens <= 0) return 0;
  std::int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

TuningCache parse_tuning_cache(std::string_view text, const std::string& source) {
  require(text.size() <= kTuningCacheMaxBytes, source + ": larger than " + std::to_string(kTuningCacheMaxBytes) + " bytes");
  const JsonValue root = parse_json(text, source);
  Fields f(root, source);
  const std::string format = f.string("format");
  require(format == kFormat, source + ": format: expected \"" + std::string(kFormat) + "\", given '" + format + "'");
  const std::int64_t version = f.integer("version", 0, 1 << 20);
  require(version == kFormatVersion, source + ": version: expected " + std::to_string(kFormatVersion) +
                                         " (this moekit's format), given " + std::to_string(version));
  const auto& items = f.required("entries").as_array(f.name("entries"));
  require(items.size() <= kTuningCacheMaxEntries,
          source + ": entries: expected at most " + std::to_string(kTuningCacheMaxEntries));
  f.finish();
  TuningCache cache;
  std::set<decltype(slot(TuningEntry{}))> seen;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string what = source + ": entries[" + std::to_string(i) + "]";
    TuningEntry e = parse_entry(items[i], what);
    require(seen.insert(slot(e)).second, what + ": a second entry for the same GPU, problem, step and tokens");
    cache.entries.push_back(std::move(e));
  }
  return cache;
}

TuningCache read_tuning_cache(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  require(file != nullptr, path + ": cannot open the tuning cache");
  std::string text;
  char buffer[1 << 16];
  std::size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    text.append(buffer, got);
    require(text.size() <= kTuningCacheMaxBytes, path + ": larger than " + std::to_string(kTuningCacheMaxBytes) + " bytes");
  }
  require(!std::ferror(file.get()), path + ": read error");
  return parse_tuning_cache(text, path);
}

std::string write_tuning_cache(const TuningCache& cache) {
  std::string s = "{\n  \"format\": \"" + std::string(kFormat) + "\",\n  \"version\": " + std::to_string(kFormatVersion) +
                  ",\n  \"entries\": [";
  for (std::size_t i = 0; i < cache.entries.size(); ++i) {
    const TuningEntry& e = cache.entries[i];
    const TuningProblem& p = e.problem;
    s += i ? ",\n    {" : "\n    {";
    s += "\"gpu\": " + json_quote(e.device.gpu) + ", \"sms\": " + std::to_string(e.device.sms) +
         ", \"cuda\": " + json_quote(e.device.cuda) + ", \"moekit\": " + json_quote(e.device.moekit) + ",\n     ";
    s += "\"problem\": {\"experts\": " + std::to_string(p.experts) + ", \"hidden\": " + std::to_string(p.hidden) +
         ", \"intermediate\": " + std::to_string(p.intermediate) + ", \"top_k\": " + std::to_string(p.top_k) +
         ", \"ep_size\": " + std::to_string(p.ep_size) + ", \"activation\": \"" + std::string(to_string(p.activation)) +
         "\", \"quant\": \"" + std::string(to_string(p.quant)) + "\", \"scale_format\": \"" +
         std::string(to_string(p.scale_format)) + "\", \"fp8_accumulation\": \"" + std::string(to_string(p.accumulation)) +
         "\", \"batch_invariant\": " + (p.batch_invariant ? "true" : "false") + "},\n     ";
    s += "\"step\": " + json_quote(e.step) + ", \"tokens\": " + std::to_string(e.tokens) + ",\n     ";
    s += "\"winner\": " + time_json(e.winner) + ",\n     \"runners_up\": [";
    for (std::size_t r = 0; r < e.runners_up.size(); ++r) s += (r ? ", " : "") + time_json(e.runners_up[r]);
    s += "]";
    if (!e.measured.empty()) s += ",\n     \"measured\": " + json_quote(e.measured);
    s += "}";
  }
  s += cache.entries.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return s;
}

void merge_tuning_entries(TuningCache& cache, const std::vector<TuningEntry>& entries) {
  for (const TuningEntry& e : entries) {
    bool replaced = false;
    for (TuningEntry& old : cache.entries)
      if (slot(old) == slot(e)) {
        old = e;
        replaced = true;
      }
    if (!replaced) cache.entries.push_back(e);
  }
}

}  // namespace moekit::io
