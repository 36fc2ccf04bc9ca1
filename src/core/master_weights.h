// Real-valued weights, row by row, for the ideal reference (DESIGN §8).
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/layer.h"

namespace moekit::core {

enum class Projection : std::uint8_t { w13, w2 };

class MasterWeights {
 public:
  virtual ~MasterWeights() = default;
  // Row n of the local expert's matrix: w13 [W, H] rows have H values, w2 [H, I] rows I values.
  virtual void row(Projection which, std::int64_t local_expert, std::int64_t n, double* out) const = 0;
};

// The weights as given (quantized values times their scales): what a checkpoint holds.
class DequantizedWeights final : public MasterWeights {
 public:
  DequantizedWeights(const MoEConfig& config, const Weights& weights) : config_(config), weights_(weights) {}
  void row(Projection which, std::int64_t local_expert, std::int64_t n, double* out) const override;

 private:
  MoEConfig config_;
  Weights weights_;
};

}  // namespace moekit::core
