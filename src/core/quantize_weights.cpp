// moekit::quantize_weights (quant.h): one scale per expert, per row or per 128x128 block.
#include <algorithm>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/validate.h"
#include "cpu/quant.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit {
namespace {

std::vector<std::int64_t> scale_shape_of(QuantScheme scheme, std::int64_t e, std::int64_t n, std::int64_t k) {
  switch (scheme) {
    case QuantScheme::fp8_tensor: return {e};
    case QuantScheme::fp8_rowwise: return {e, n};
    default: return {e, ceil_div(n, kBlock), ceil_div(k, kBlock)};
  }
}

}  // namespace

void quantize_weights(QuantScheme scheme, ScaleFormat format, const TensorView& w, const TensorView& q,
                      const TensorView& scales) {
  require(scheme != QuantScheme::bf16, "quant: expected an FP8 scheme (fp8-tensor|fp8-rowwise|fp8-block), given bf16");
  require(w.defined() && w.rank == 3, "w: expected [E, N, K] f32|bf16, given " + w.to_string());
  const std::int64_t experts = w.size(0), n = w.size(1), k = w.size(2);
  core::check_tensor("w", w, {DType::f32, DType::bf16}, {experts, n, k}, Device::cpu);
  core::check_tensor("q", q, {DType::fp8_e4m3}, {experts, n, k}, Device::cpu);
  core::check_tensor("scales", scales, {DType::f32}, scale_shape_of(scheme, experts, n, k), Device::cpu);
  const std::int64_t band = scheme == QuantScheme::fp8_block ? kBlock : scheme == QuantScheme::fp8_rowwise ? 1 : n;
  const std::int64_t bands = ceil_div(n, band), k_groups = scheme == QuantScheme::fp8_block ? ceil_div(k, kBlock) : 1;
  const std::int64_t group_k = scheme == QuantScheme::fp8_block ? kBlock : k;
  // One task per band of rows of one expert: its rows as f32, then each group's scale and codes.
  core::parallel_for(experts * std::max<std::int64_t>(bands, 1), 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> rows_f32;
    for (std::int64_t task = begin; task < end && bands > 0; ++task) {
      const std::int64_t e = task / bands, n0 = (task % bands) * band, rows = std::min(band, n - n0);
      const std::int64_t first = (e * n + n0) * k;
      rows_f32.resize(std::size_t(rows * k));
      for (std::int64_t i = 0; i < rows * k; ++i)
        rows_f32[std::size_t(i)] =
            w.dtype == DType::f32 ? w.ptr<float>()[first + i] : bf16_to_float(w.ptr<bf16>()[first + i]);
      for (std::int64_t g = 0; g < k_groups; ++g) {
        const std::int64_t k0 = g * group_k, len = std::min(group_k, k - k0);
        float m = 0.0f;
        for (std::int64_t r = 0; r < rows; ++r) m = std::max(m, cpu::amax(rows_f32.data() + r * k + k0, len));
        const float scale = fp8_scale(m, format);
        const std::int64_t at = scheme == QuantScheme::fp8_tensor    ? e
                                : scheme == QuantScheme::fp8_rowwise ? e * n + n0
                                                                     : (e * bands + n0 / kBlock) * k_groups + g;
        scales.ptr<float>()[at] = scale;
        for (std::int64_t r = 0; r < rows; ++r)
          cpu::quantize_with_scale(rows_f32.data() + r * k + k0, len, scale, q.ptr<std::uint8_t>() + first + r * k + k0);
      }
    }
  });
}

}  // namespace moekit
