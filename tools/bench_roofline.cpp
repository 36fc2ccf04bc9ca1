#include "bench_roofline.h"

#include <algorithm>
#include <vector>

#include "moekit/quant.h"

namespace moekit::cli {

double matrix_tflops(const Ceilings& c, QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::bf16: return c.bf16_tflops;
    case QuantScheme::fp8_tensor:
    case QuantScheme::fp8_rowwise: return c.fp8_tflops;
    case QuantScheme::fp8_block: return c.fp8_block_tflops;
  }
  return 0.0;
}

double Roofline::floor_us(const Ceilings& c, QuantScheme scheme) const {
  const double p = matrix_tflops(c, scheme);
  const double compute = p > 0 ? flops / (p * 1e12) : 0.0;
  const double memory = c.copy_gbs > 0 ? bytes / (c.copy_gbs * 1e9) : 0.0;
  return std::max(compute, memory) * 1e6;
}

Roofline roofline(const MoEConfig& c, const TensorView& ids) {
  const std::int64_t h = c.hidden_size, i = c.intermediate_size, w = c.gemm1_width();
  std::vector<bool> touched(std::size_t(c.local_experts()), false);
  std::int64_t pairs = 0;
  for (std::int64_t s = 0; s < ids.numel(); ++s) {
    const std::int64_t e = std::int64_t(ids.ptr<std::int32_t>()[s]) - c.first_local_expert();
    if (e < 0 || e >= c.local_experts()) continue;
    touched[std::size_t(e)] = true;
    ++pairs;
  }
  Roofline r;
  r.experts_touched = std::count(touched.begin(), touched.end(), true);
  r.flops = 2.0 * double(pairs) * double(h * w + i * h);
  const double elem = c.quant.scheme == QuantScheme::bf16 ? 2.0 : 1.0;
  double scales = 0.0;
  switch (c.quant.scheme) {
    case QuantScheme::bf16: break;
    case QuantScheme::fp8_tensor: scales = 2 * 4; break;
    case QuantScheme::fp8_rowwise: scales = double(w + h) * 4; break;
    case QuantScheme::fp8_block:
      scales = double(ceil_div(w, kBlock) * ceil_div(h, kBlock) + ceil_div(h, kBlock) * ceil_div(i, kBlock)) * 4;
      break;
  }
  const double per_expert = double(w * h + h * i) * elem + scales;
  const double tokens = double(ids.defined() ? ids.size(0) : 0);
  r.bytes = double(r.experts_touched) * per_expert + 2.0 * tokens * double(h) * 2.0;
  return r;
}

}  // namespace moekit::cli
