// The performance contract of DESIGN §9: FLOPs, bytes and the roofline floor of one layer call.
#pragma once

#include <cstdint>

#include "bench_gpu.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cli {

struct Roofline {
  double flops = 0;
  double bytes = 0;
  std::int64_t experts_touched = 0;
  // max(FLOPs / P, bytes / B) with P the scheme's matrix rate; 0 without ceilings.
  double floor_us(const Ceilings& c, QuantScheme scheme) const;
};

// FLOPs = 2 T k (H 2I + I H) over the pairs that exist; bytes = the weights (and scales) of every
// local expert with at least one token + hidden in and out once.
Roofline roofline(const MoEConfig& config, const TensorView& topk_ids);

}  // namespace moekit::cli
