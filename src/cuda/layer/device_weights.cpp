#include "cuda/layer/device_weights.h"

#include <vector>

#include "moekit/quant.h"

namespace moekit::cuda {
namespace {

DeviceTensor copy_of(const TensorView& host) {
  DeviceTensor t(host.dtype, host.shape_vector(), Device::cuda);
  t.copy_from(host);
  return t;
}

DeviceTensor placeholder() { return DeviceTensor(DType::f32, {1}, Device::cuda); }

// The public scales of one projection [E, N, K] in the GEMM's layout.
DeviceTensor gemm_scales(QuantScheme scheme, const TensorView& scales, std::int64_t experts, std::int64_t n,
                         std::int64_t k) {
  if (scheme == QuantScheme::bf16) return placeholder();
  const std::int64_t kb = ceil_div(k, kBlock);
  const std::int64_t cols = scheme == QuantScheme::fp8_block ? ceil_div(n, kBlock) : n;
  Tensor host(DType::f32, {experts, kb, cols});
  const float* s = scales.ptr<float>();
  for (std::int64_t e = 0; e < experts; ++e)
    for (std::int64_t b = 0; b < kb; ++b)
      for (std::int64_t j = 0; j < cols; ++j) {
        float v = 0.0f;
        switch (scheme) {
          case QuantScheme::fp8_block: v = s[(e * cols + j) * kb + b]; break;  // [E, NB, KB] -> [E, KB, NB]
          case QuantScheme::fp8_rowwise: v = s[e * n + j]; break;
          case QuantScheme::fp8_tensor: v = s[e]; break;
          case QuantScheme::bf16: break;
        }
        host.ptr<float>()[(e * kb + b) * cols + j] = v;
      }
  return copy_of(host.view());
}

}  // namespace

GemmKind gemm_kind(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::bf16: return GemmKind::bf16;
    case QuantScheme::fp8_block: return GemmKind::fp8_block;
    case QuantScheme::fp8_rowwise:
    case QuantScheme::fp8_tensor: return GemmKind::fp8_channel;
  }
  return GemmKind::bf16;
}

DeviceWeights DeviceWeights::upload(const MoEConfig& c, const Weights& w) {
  const QuantScheme scheme = c.quant.scheme;
  const std::int64_t el = c.local_experts();
  DeviceWeights d{
      {copy_of(w.w13), gemm_scales(scheme, w.w13_scale, el, c.gemm1_width(), c.hidden_size)},
      {copy_of(w.w2), gemm_scales(scheme, w.w2_scale, el, c.hidden_size, c.intermediate_size)},
      w.e_score_correction_bias.defined() ? copy_of(w.e_score_correction_bias) : placeholder(),
      w.w13_input_scale.defined() ? copy_of(w.w13_input_scale) : placeholder(),
      w.w2_input_scale.defined() ? copy_of(w.w2_input_scale) : placeholder(),
  };
  d.has_bias = w.e_score_correction_bias.defined();
  d.has_w13_input_scale = w.w13_input_scale.defined();
  d.has_w2_input_scale = w.w2_input_scale.defined();
  return d;
}

}  // namespace moekit::cuda
