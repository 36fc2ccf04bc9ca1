#include "bench_json.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "git_commit.h"
#include "moekit/error.h"
#include "moekit/moekit.h"

namespace moekit::cli {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", c);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(7);
  s << v;
  return s.str();
}

namespace {

std::string quoted(const std::string& s) { return json_string(s); }
std::string number(double v) { return json_number(v); }

}  // namespace

void write_bench_json(const std::string& path, const BenchRecord& r) {
  std::ostringstream j;
  j << "{\"moekit_version\": " << quoted(std::string(version())) << ", \"git_commit\": " << quoted(MOEKIT_GIT_COMMIT)
    << ", \"backend\": " << quoted(r.backend) << ", \"routing\": " << quoted(r.routing)
    << (r.skew.empty() ? "" : ", \"skew\": " + quoted(r.skew))
    << ", \"gpu\": " << quoted(r.gpu.name) << ", \"driver\": " << quoted(r.gpu.driver) << ", \"sms\": " << r.gpu.sms
    << ",\n \"ceilings\": {\"copy_gbs\": " << number(r.ceilings.copy_gbs)
    << ", \"bf16_tflops\": " << number(r.ceilings.bf16_tflops) << ", \"fp8_tflops\": " << number(r.ceilings.fp8_tflops)
    << ", \"fp8_block_tflops\": " << number(r.ceilings.fp8_block_tflops)
    << ", \"source\": " << quoted(r.ceilings.source) << "},\n \"cases\": [";
  for (std::size_t i = 0; i < r.cases.size(); ++i) {
    const BenchCase& c = r.cases[i];
    j << (i ? ",\n  " : "\n  ") << "{\"preset\": " << quoted(c.preset) << ", \"quant\": " << quoted(c.quant)
      << ", \"tokens\": " << c.tokens << ", \"us\": " << number(c.us)
      << ", \"tflops\": " << number(c.roof.flops / c.us / 1e6) << ", \"gbs\": " << number(c.roof.bytes / c.us / 1e3)
      << ", \"flops\": " << number(c.roof.flops) << ", \"bytes\": " << number(c.roof.bytes)
      << ", \"experts_touched\": " << c.roof.experts_touched << ", \"busiest_rows\": " << c.load.busiest
      << ", \"empty_experts\": " << c.load.empty << ", \"floor_us\": " << number(c.floor_us)
      << ", \"efficiency\": " << (c.floor_us > 0 ? number(c.floor_us / c.us) : "null")
      << ", \"graph\": " << (c.graph ? "true" : "false");
    if (!c.tuning.empty()) j << ", \"tuning_cache\": " << quoted(c.tuning);
    if (c.host_us > 0) j << ", \"host_us\": " << number(c.host_us);
    if (c.routed_us > 0) j << ", \"routed_us\": " << number(c.routed_us) << ", \"shared_us\": " << number(c.shared_us);
    auto steps = [&](const char* key, const std::vector<std::pair<std::string, double>>& steps) {
      if (steps.empty()) return;
      j << ", \"" << key << "\": {";
      for (std::size_t s = 0; s < steps.size(); ++s)
        j << (s ? ", " : "") << quoted(steps[s].first) << ": " << number(steps[s].second);
      j << "}";
    };
    steps("host_steps", c.host_steps);
    steps("stages", c.stages);
    steps("graph_stages", c.graph_stages);
    j << "}";
  }
  j << "\n]}\n";
  std::ofstream out(path);
  out << j.str();
  if (!out) throw Error("--json: cannot write " + path);
}

}  // namespace moekit::cli
