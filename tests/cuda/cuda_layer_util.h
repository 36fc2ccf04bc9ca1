// Helpers of the CUDA layer tests: device copies of host tensors, poisoned outputs, and the check
// of DESIGN §8 against the two references (core/check.h).
#pragma once

#include <cuda_runtime_api.h>

#include "core/check.h"
#include "cpu/layer_util.h"
#include "cuda_test_util.h"
#include "moekit/device.h"

namespace moekit::test {

inline DeviceTensor on_gpu(const Tensor& host) {
  DeviceTensor d(host.dtype(), host.shape(), Device::cuda);
  d.copy_from(host.view());
  return d;
}

inline Tensor to_host(const DeviceTensor& d) {
  Tensor t(d.view().dtype, d.view().shape_vector());
  d.copy_to(t.view());
  return t;
}

inline DeviceTensor poisoned(DType dtype, std::vector<std::int64_t> shape) {
  DeviceTensor d(dtype, std::move(shape), Device::cuda);
  cudaMemset(d.view().data, 0xff, d.view().nbytes());
  return d;
}

// The two references of DESIGN §8 for a synthetic layer's output.
struct References {
  Tensor pipeline;            // [T, H] bf16
  std::vector<double> ideal;  // [T * H], f64 on the unquantized weights
};

inline References make_references(const MoEConfig& config, const TestLayer& layer, std::uint64_t seed,
                                  const Tensor& hidden, const Routing& r) {
  References refs{run_pipeline_reference(config, layer.weights(), hidden, r), {}};
  const cpu::ReferenceInputs in{config, layer.weights(), hidden.view(), r.ids.view(), r.weights.view()};
  refs.ideal = cpu::ideal_reference(in, core::SyntheticMaster(config, seed));
  return refs;
}

inline core::CheckResult design_check(const Tensor& out, const References& refs, const QuantConfig& quant) {
  return core::check_output({out.view(), refs.pipeline.view(), refs.ideal, quant});
}

// DESIGN §8's rule, but for fp8-tensor with a dynamic scale: its global figure within
// core::kDynamicScaleTolerance (core/check.h says why), its other rules whole.
inline void expect_meets_the_check(const core::CheckResult& r, const LayerCase& c) {
  if (c.scheme != QuantScheme::fp8_tensor || c.static_scales) {
    EXPECT_TRUE(r.pass()) << case_name(c) << ": " << r.to_string();
    return;
  }
  for (const core::CheckRule rule : {core::CheckRule::finite, core::CheckRule::ideal, core::CheckRule::row})
    EXPECT_TRUE(r.passed(rule)) << case_name(c) << ": " << core::to_string(rule) << " failed: " << r.to_string();
  EXPECT_LE(r.rel_err, core::kDynamicScaleTolerance) << case_name(c) << ": " << r.to_string();
}

}  // namespace moekit::test
