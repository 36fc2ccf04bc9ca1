#include "cuda/layer/device_weights.h"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "moekit/quant.h"

namespace moekit::cuda {
namespace {

struct ScaleShape {
  std::int64_t experts, n, k_blocks, cols;  // out: [experts, k_blocks, cols]
};

// out[e, b, j] from the public scales: fp8-block [E, NB, KB] (cols = NB), per-row [E, N] and
// per-tensor [E] (cols = N), the same value for every K block b.
__global__ void gemm_scale_layout(const float* in, QuantScheme scheme, ScaleShape s, float* out) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= s.experts * s.k_blocks * s.cols) return;
  const std::int64_t j = i % s.cols, b = i / s.cols % s.k_blocks, e = i / (s.cols * s.k_blocks);
  float v = 0.0f;
  switch (scheme) {
    case QuantScheme::fp8_block: v = in[(e * s.cols + j) * s.k_blocks + b]; break;
    case QuantScheme::fp8_rowwise: v = in[e * s.n + j]; break;
    case QuantScheme::fp8_tensor: v = in[e]; break;
    case QuantScheme::bf16: break;
  }
  out[i] = v;
}

// The device this process is using: where borrowed tensors must live.
void check_on_current_device(const char* name, const TensorView& t) {
  cudaPointerAttributes a{};
  MOEKIT_CUDA_CHECK(cudaPointerGetAttributes(&a, t.data));
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  require(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged,
          std::string(name) + ": expected CUDA device memory, given a pointer the CUDA runtime does not know as such");
  require(a.device == device, std::string(name) + ": expected memory of CUDA device " + std::to_string(device) +
                                  " (the current one), given memory of device " + std::to_string(a.device));
}

// Borrows what is on the device, copies the rest, all on one stream; finish() waits for it.
class Preparer {
 public:
  Preparer(DeviceWeights& out, core::Preparation how, Stream stream) : out_(out), how_(how), stream_(stream) {}

  // The tensor in device memory: borrowed when it is there, else a copy.
  TensorView on_device(const char* name, const TensorView& given) { return device_view(name, given, out_.owned); }

  // The scales of one projection [E, N, K] in the GEMM's layout; absent for bf16.
  TensorView gemm_scales(const char* name, QuantScheme scheme, const TensorView& given, ScaleShape s) {
    if (scheme == QuantScheme::bf16) return {};
    TensorView v = TensorView::contiguous(nullptr, DType::f32, {s.experts, s.k_blocks, s.cols}, Device::cuda);
    if (how_ == core::Preparation::layout_only) return v;
    const TensorView in = device_view(name, given, temporaries_);
    v = out_.owned.emplace_back(DType::f32, v.shape_vector(), Device::cuda).view();
    if (const std::int64_t n = v.numel(); n > 0) {
      gemm_scale_layout<<<grid_size(n, 256), 256, 0, as_cuda(stream_)>>>(in.ptr<float>(), scheme, s, v.ptr<float>());
      MOEKIT_CUDA_CHECK_LAUNCH("gemm_scale_layout");
    }
    return v;
  }

  void finish() {
    if (how_ == core::Preparation::memory) MOEKIT_CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream_)));
    temporaries_.clear();
  }

 private:
  TensorView device_view(const char* name, const TensorView& given, std::vector<DeviceTensor>& copies) {
    if (!given.defined()) return {};
    TensorView v = given;
    v.device = Device::cuda;
    if (how_ == core::Preparation::layout_only) {
      v.data = nullptr;
      return v;
    }
    if (given.device == Device::cuda) {
      if (given.numel() > 0) check_on_current_device(name, given);
      return given;
    }
    v = copies.emplace_back(given.dtype, given.shape_vector(), Device::cuda).view();
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(v.data, given.data, given.nbytes(), cudaMemcpyHostToDevice, as_cuda(stream_)));
    return v;
  }

  DeviceWeights& out_;
  core::Preparation how_;
  Stream stream_;
  std::vector<DeviceTensor> temporaries_;  // host scales uploaded for the relayout
};

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

std::shared_ptr<const DeviceWeights> DeviceWeights::prepare(const MoEConfig& c, const Weights& w,
                                                            core::Preparation how, Stream stream) {
  auto d = std::make_shared<DeviceWeights>();
  Preparer p(*d, how, stream);
  const QuantScheme scheme = c.quant.scheme;
  const std::int64_t el = c.local_experts(), h = c.hidden_size, width = c.gemm1_width(), inter = c.intermediate_size;
  const std::int64_t h_blocks = ceil_div(h, kBlock);
  const bool block = scheme == QuantScheme::fp8_block;
  d->w13 = p.on_device("w13", w.w13);
  d->w2 = p.on_device("w2", w.w2);
  d->w13_scales = p.gemm_scales("w13_scale", scheme, w.w13_scale,
                                {el, width, h_blocks, block ? ceil_div(width, kBlock) : width});
  d->w2_scales = p.gemm_scales("w2_scale", scheme, w.w2_scale,
                               {el, h, ceil_div(inter, kBlock), block ? h_blocks : h});
  d->bias = p.on_device("e_score_correction_bias", w.e_score_correction_bias);
  d->w13_input_scale = p.on_device("w13_input_scale", w.w13_input_scale);
  d->w2_input_scale = p.on_device("w2_input_scale", w.w2_input_scale);
  p.finish();
  for (const DeviceTensor& t : d->owned) d->owned_bytes += t.view().nbytes();
  return d;
}

}  // namespace moekit::cuda
