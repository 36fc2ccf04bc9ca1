#include "core/master_weights.h"

#include "moekit/quant.h"

namespace moekit::core {

void DequantizedWeights::row(Projection which, std::int64_t e, std::int64_t n, double* out) const {
  const bool w13 = which == Projection::w13;
  const TensorView& values = w13 ? weights_.w13 : weights_.w2;
  const TensorView& scales = w13 ? weights_.w13_scale : weights_.w2_scale;
  const std::int64_t rows = values.size(1), k = values.size(2);
  const std::int64_t base = (e * rows + n) * k;
  for (std::int64_t i = 0; i < k; ++i) {
    if (config_.quant.scheme == QuantScheme::bf16) {
      out[i] = bf16_to_float(values.ptr<bf16>()[base + i]);
      continue;
    }
    const double q = fp8_e4m3_decode(values.ptr<std::uint8_t>()[base + i]);
    const float* s = scales.ptr<float>();
    switch (config_.quant.scheme) {
      case QuantScheme::fp8_tensor: out[i] = q * s[e]; break;
      case QuantScheme::fp8_rowwise: out[i] = q * s[e * rows + n]; break;
      default: {
        const std::int64_t kbs = ceil_div(k, kBlock);
        out[i] = q * s[(e * ceil_div(rows, kBlock) + n / kBlock) * kbs + i / kBlock];
      }
    }
  }
}

}  // namespace moekit::core
