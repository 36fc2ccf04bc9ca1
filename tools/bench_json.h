// What `moekit bench` measured, and its JSON form (read by bench/report.py and bench/plot.py).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_gpu.h"
#include "bench_roofline.h"
#include "core/skew.h"

namespace moekit::cli {

struct BenchCase {
  std::string preset, quant;
  std::int64_t tokens = 0;
  double us = 0;
  bool graph = false;
  Roofline roof;
  core::RoutingLoad load;                              // of input set 0's routing
  std::string skew;                                    // --skew ("" without)
  double floor_us = 0;                                 // 0 without ceilings (CPU)
  double host_us = 0;                                  // GPU: the median host time of one eager call (enqueue, no wait)
  std::vector<std::pair<std::string, double>> host_steps;  // GPU: where that host time goes, per step
  std::vector<std::pair<std::string, double>> stages;  // --stages: each step's µs, eager
  std::vector<std::pair<std::string, double>> graph_stages;  // --stages, graph cases: each step's µs in graph replays
  std::string tuning;                                  // --tuning-cache: the cache the layer read ("" not given)
  std::string tuning_read;                             // what the layer made of it: its entries, or why none
  double routed_us = 0, shared_us = 0;                 // --shared-experts: the layer's two parts timed apart
};

struct BenchRecord {
  std::string backend, routing;
  std::string skew;    // --skew ("" without)
  GpuInfo gpu;         // empty on the CPU
  Ceilings ceilings;   // zeros on the CPU
  std::vector<BenchCase> cases;
};

// A JSON string literal of s, and a number (null when not finite).
std::string json_string(const std::string& s);
std::string json_number(double v);

// The version, the git commit the binary was built from, the machine and every case.
void write_bench_json(const std::string& path, const BenchRecord& record);

}  // namespace moekit::cli
