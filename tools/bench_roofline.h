// The performance contract of DESIGN §9: FLOPs, bytes and the roofline floor of one layer call.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cli {

struct Ceilings {
  double matrix_tflops = 0;  // P: the FP8 (or bf16) matrix rate
  double copy_gbs = 0;       // B: the copy bandwidth
  const char* source = "";
};

struct Roofline {
  double flops = 0;
  double bytes = 0;
  std::int64_t experts_touched = 0;
  double floor_us(const Ceilings& c) const;
};

// FLOPs = 2 T k (H 2I + I H) over the pairs that exist; bytes = the weights (and scales) of every
// local expert with at least one token + hidden in and out once.
Roofline roofline(const MoEConfig& config, const TensorView& topk_ids);

}  // namespace moekit::cli
